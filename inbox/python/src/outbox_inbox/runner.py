"""A Kafka consumer loop that settles every record through an inbox and commits its offsets."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import pymysql
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from .inbox import Handler, Inbox, ProcessResult, retry_at, retry_tier
from .topics import ensure_topic

__all__ = ["InboxRunner", "Processor"]

log = logging.getLogger("outbox_inbox")


class Processor(Protocol):
    """Anything that settles one record like :meth:`Inbox.process` (an :class:`Inbox`)."""

    def process(self, record: Message, handler: Handler) -> ProcessResult: ...


class InboxRunner:
    """Owns a confluent-kafka ``Consumer``: subscribes, polls, settles each record in partition
    order through ``processor.process(record, handler)``, and commits the processed offsets
    synchronously after each poll batch and when partitions are revoked. Offsets never pass a
    record that is not settled.

    ``consumer_config`` holds librdkafka properties (``bootstrap.servers`` at least);
    ``group.id`` defaults to the inbox's consumer name, ``enable.auto.commit`` is forced off.
    A poll batch is the records ready without waiting, up to ``max_batch`` (the first one is
    waited for at most ``poll_timeout`` seconds per poll); each record is settled as soon as it is
    polled. ``on_settled(record, result, polled_at)`` is called
    after each record is settled, ``polled_at`` being the ``time.monotonic()`` of the poll that
    returned it. Single use: :meth:`run` closes the consumer when it returns.

    With an :class:`Inbox` as processor, the dead-letter topic is checked at construction and
    created with the broker's defaults when missing (:func:`ensure_topic`); when the broker
    refuses, :class:`DeadLetterTopicError` names the topic and the fix.

    With retry tiers (``InboxSettings.retry_tiers``, or a topic's own in
    ``InboxSettings.topics``) the runner also subscribes to the tier topics of each of its
    topics, as many as that topic has tiers (created at construction like the dead-letter
    topic). A retry copy whose ``retry_at`` has not come pauses its partition (position back to
    the copy, nothing of it committed) until then, while the other partitions go on.

    Batch mode (``InboxSettings.batch_max_records`` > 1, with an :class:`Inbox`): each poll
    returns up to ``batch_max_records`` records (waiting up to ``batch_max_wait`` for more once
    one arrived; ``max_batch`` is then not used); the consecutive ordinary records go to
    :meth:`Inbox.process_batch` in one transaction, each retry copy alone to
    :meth:`Inbox.process`; the offsets are committed after each poll. ``on_settled`` is called
    per record once its batch settled.

    With ``InboxSettings.metrics_registry`` set, the runner sets
    ``outbox_inbox_consumer_lag{consumer, topic, partition}`` after each poll that returned a
    record: the partition's high watermark (as last fetched) minus the consumer's position.
    """

    def __init__(
        self,
        processor: Processor,
        handler: Handler,
        consumer_config: dict,
        topics: Sequence[str],
        *,
        max_batch: int = 500,
        poll_timeout: float = 0.5,
        on_settled: Callable[[Message, ProcessResult, float], None] | None = None,
    ) -> None:
        config = dict(consumer_config)
        if isinstance(processor, Inbox):
            config.setdefault("group.id", processor.settings.consumer)
            processor.consumer_group = str(config["group.id"])  # the spans' consumer group name
            # The dead-letter topic exists, is created now, or the runner refuses to start.
            ensure_topic(config, processor.settings.dead_letter_topic)
            # Likewise the retry tiers' topics, subscribed to as well.
            tier_topics = [t for topic in topics for t in processor.settings.retry_topics(topic)]
            for tier_topic in tier_topics:
                ensure_topic(
                    config,
                    tier_topic,
                    role="retry tier topic",
                    fix="set retry_topic_format so that it names existing topics",
                )
        else:
            tier_topics = []
        config["enable.auto.commit"] = False
        config["enable.auto.offset.store"] = False
        self._processor = processor
        self._handler = handler
        self._topics = list(topics) + [t for t in tier_topics if t not in topics]
        self._max_batch = max_batch
        self._poll_timeout = poll_timeout
        self._on_settled = on_settled
        self._consumer = Consumer(config)
        self._metrics = processor.metrics if isinstance(processor, Inbox) else None
        self._stop = threading.Event()
        self._batch = (
            processor.settings.batch_max_records
            if isinstance(processor, Inbox) and processor.settings.batch_max_records > 1
            else 0
        )
        self._tier_topics = set(tier_topics)
        self._lost: set[tuple[str, int]] = set()  # partitions lost during a batch's 2nd call
        self._subscribed = False
        self._pending: dict[tuple[str, int], int] = {}  # (topic, partition) -> next offset
        # Partitions paused on a retry copy whose retry_at has not come -> when to resume them
        # (time.time() seconds).
        self._waiting: dict[tuple[str, int], float] = {}

    def subscribe(self) -> None:
        """Subscribe to the topics (done by :meth:`run` when not done before). Non-blocking."""
        if not self._subscribed:
            self._consumer.subscribe(self._topics, on_revoke=self._on_revoke, on_lost=self._on_lost)
            self._subscribed = True

    def stop(self) -> None:
        """Ask :meth:`run` to return after the record in hand. Safe from signal handlers and other
        threads."""
        self._stop.set()

    def install_signal_handlers(self) -> None:
        """Make SIGTERM and SIGINT call :meth:`stop` (main thread only)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda _signum, _frame: self.stop())

    def run(self) -> None:
        """Poll and settle records until :meth:`stop`; then commit the processed offsets and
        close the consumer. Raises what the processor raises (e.g.
        :class:`~outbox_inbox.DeadLetterError`, or :class:`~outbox_inbox.OutageError` after a
        database outage longer than ``outage_budget``) or a fatal ``KafkaException``, after
        committing the offsets of the records settled before and closing the consumer; the record
        in hand and those after it are not committed, so a restarted runner resumes with it."""
        self.subscribe()
        # Parked versions: swept before the first poll and every park_sweep_interval, checked
        # between records so a busy partition does not starve the sweep.
        sweeps = isinstance(self._processor, Inbox) and self._processor.parks
        last_sweep: float | None = None
        try:
            in_batch = 0
            while not self._stop.is_set():
                if sweeps and (
                    last_sweep is None
                    or time.monotonic() - last_sweep >= self._processor.settings.park_sweep_interval
                ):
                    last_sweep = time.monotonic()
                    try:
                        self._processor.sweep_parked(self._handler)
                    except pymysql.err.MySQLError as error:
                        log.warning("parked sweep failed (next one later): %s", error)
                if self._batch:
                    self._poll_batch()
                    continue
                # One record per poll: a rebalance happens inside poll(), so no record in hand
                # ever belongs to a partition revoked meanwhile.
                timeout = 0 if in_batch else self._poll_timeout
                due = self._resume_due()
                if due is not None:  # wake up when the next paused partition is due
                    timeout = min(timeout, max(due - time.time(), 0.001))
                record = self._consumer.poll(timeout)
                polled_at = time.monotonic()
                if record is None:  # nothing more ready: the batch is complete
                    self._commit()
                    in_batch = 0
                    continue
                if not self._usable(record):
                    continue
                if self._metrics is not None:
                    self._record_lag(record)
                tp = (record.topic(), record.partition())
                if tp in self._waiting:
                    continue  # paused on an earlier copy: fetched again once resumed
                at = retry_at(record)
                if at is not None and time.time() < at:
                    self._wait(record, at)
                    continue
                result = self._processor.process(record, self._handler)
                self._pending[(record.topic(), record.partition())] = record.offset() + 1
                if self._on_settled is not None:
                    self._on_settled(record, result, polled_at)
                in_batch += 1
                if in_batch >= self._max_batch:
                    self._commit()
                    in_batch = 0
        finally:
            try:
                self._commit()
            finally:
                self._consumer.close()

    def _poll_batch(self) -> None:
        """Batch mode: one poll of up to ``batch_max_records`` records (after the first, more
        for at most ``batch_max_wait``), settled in consecutive runs (ordinary records:
        ``process_batch``; each retry copy: ``process``), then their offsets committed."""
        timeout = self._poll_timeout
        due = self._resume_due()
        if due is not None:  # wake up when the next paused partition is due
            timeout = min(timeout, max(due - time.time(), 0.001))
        first = self._consumer.poll(timeout)
        polled_at = time.monotonic()
        if first is None:
            self._commit()
            return
        records = [first]
        wait = self._processor.settings.batch_max_wait
        self._lost.clear()
        records += self._consumer.consume(self._batch - 1, wait)
        if (first.topic(), first.partition()) in self._lost:
            # Revoked by a rebalance inside the second call: no longer ours (not committed; its
            # partition's new owner, or this consumer once it gets it back, reads it again).
            # What the second call returned was fetched after the rebalance.
            records = records[1:]
        # The first record was returned by the first call, the others by the second.
        first_polled_at, polled_at = polled_at, time.monotonic()
        run: list[Message] = []
        last: dict[tuple[str, int], Message] = {}
        for record in records:
            if not self._usable(record):
                continue
            tp = (record.topic(), record.partition())
            last[tp] = record
            if tp in self._waiting:
                continue  # paused on an earlier copy: fetched again once resumed
            if record.topic() in self._tier_topics or retry_tier(record) > 0:
                at = retry_at(record)
                if at is not None and time.time() < at:
                    self._wait(record, at)
                    continue
                self._settle_run(run, polled_at, first, first_polled_at)
                run = []
                result = self._processor.process(record, self._handler)
                self._settled(record, result, first_polled_at if record is first else polled_at)
                continue
            run.append(record)
        self._settle_run(run, polled_at, first, first_polled_at)
        if self._metrics is not None:
            for record in last.values():
                self._record_lag(record)
        self._commit()

    def _settle_run(
        self, run: list[Message], polled_at: float, first: Message, first_polled_at: float
    ) -> None:
        """``process_batch`` of ``run``; ``on_settled`` per record (``first_polled_at`` for
        ``first``, the record the poll's first call returned)."""
        if not run:
            return
        results = self._processor.process_batch(run, self._handler)
        for record, result in zip(run, results, strict=True):
            self._settled(record, result, first_polled_at if record is first else polled_at)

    def _settled(self, record: Message, result: ProcessResult, polled_at: float) -> None:
        self._pending[(record.topic(), record.partition())] = record.offset() + 1
        if self._on_settled is not None:
            self._on_settled(record, result, polled_at)

    def _record_lag(self, record: Message) -> None:
        """Set the lag gauge of ``record``'s partition: the high watermark last fetched minus the
        position (the next offset to read); no broker request."""
        tp = TopicPartition(record.topic(), record.partition())
        try:
            _low, high = self._consumer.get_watermark_offsets(tp, cached=True)
            (position,) = self._consumer.position([tp])
        except KafkaException as error:
            log.debug("lag of %s[%d] unknown: %s", tp.topic, tp.partition, error)
            return
        if high is None or high < 0 or position.offset < 0:
            return  # not known yet (OFFSET_INVALID)
        self._metrics.lag(tp.topic, tp.partition, max(high - position.offset, 0))

    def _wait(self, record: Message, at: float) -> None:
        """Pause the partition of a retry copy whose retry_at has not come, move its position
        back to the copy (fetched again once resumed) and remember when to resume it."""
        tp = TopicPartition(record.topic(), record.partition(), record.offset())
        self._consumer.pause([tp])
        self._consumer.seek(tp)
        self._waiting[(record.topic(), record.partition())] = at
        log.debug(
            "partition %s[%d] paused until its retry copy at offset %d is due (%.3f)",
            record.topic(),
            record.partition(),
            record.offset(),
            at,
        )

    def _resume_due(self) -> float | None:
        """Resume the paused partitions whose retry_at has come; when the next one is due
        (``None``: none is waiting)."""
        now, due = time.time(), None
        for key, at in list(self._waiting.items()):
            if at <= now:
                del self._waiting[key]
                try:
                    self._consumer.resume([TopicPartition(*key)])
                except KafkaException as error:  # no longer assigned: nothing to resume
                    log.warning("resuming %s[%d] failed: %s", key[0], key[1], error)
            elif due is None or at < due:
                due = at
        return due

    @staticmethod
    def _usable(message: Message) -> bool:
        error = message.error()
        if error is None:
            return True
        if error.fatal():
            raise KafkaException(error)
        if error.code() != KafkaError._PARTITION_EOF:
            log.warning("consumer: %s", error)
        return False

    def _commit(self, only: set[tuple[str, int]] | None = None) -> None:
        offsets = [
            TopicPartition(topic, partition, offset)
            for (topic, partition), offset in self._pending.items()
            if only is None or (topic, partition) in only
        ]
        if not offsets:
            return
        try:
            committed = self._consumer.commit(offsets=offsets, asynchronous=False) or []
        except KafkaException as error:  # e.g. a rebalance in progress: retried next batch
            log.warning("offset commit failed: %s", error)
            return
        for tp in committed:
            key = (tp.topic, tp.partition)
            if tp.error is not None:
                log.warning("offset commit of %s[%d] failed: %s", tp.topic, tp.partition, tp.error)
            elif self._pending.get(key) == tp.offset:
                del self._pending[key]

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        revoked = {(tp.topic, tp.partition) for tp in partitions}
        try:
            self._commit(revoked)
        except Exception as error:  # never raise into librdkafka's callback
            log.warning("offset commit on revocation failed: %s", error)
        self._on_lost(_consumer, partitions)

    def _on_lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._lost.add((tp.topic, tp.partition))
            self._pending.pop((tp.topic, tp.partition), None)
            self._waiting.pop((tp.topic, tp.partition), None)
            if self._metrics is not None:
                self._metrics.forget_partition(tp.topic, tp.partition)
