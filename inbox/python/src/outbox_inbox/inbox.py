"""Processing one record through the inbox (inbox/CONTRACT.md, "process(record, handler)")."""

from __future__ import annotations

import base64
import contextlib
import enum
import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pymysql
from confluent_kafka import KafkaError, Message, Producer
from opentelemetry import trace
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .metrics import InboxMetrics
from .settings import EffectiveSettings, GapPolicy, InboxSettings, backoff_delay
from .tracing import HEADERS_GETTER, INSTRUMENTATION_NAME, span_attributes

__all__ = [
    "DeadLetterError",
    "Handler",
    "Hooks",
    "Inbox",
    "OutageError",
    "Outcome",
    "ParkedRecord",
    "ParkedSweep",
    "ProcessResult",
    "dead_letter_producer",
    "is_infrastructure_error",
    "origin",
    "retry_at",
    "retry_tier",
]

log = logging.getLogger("outbox_inbox")

ER_DUP_ENTRY = 1062
_DECIMAL = re.compile(r"-?[0-9]+")
MAX_EVENT_KEY_BYTES = 1020  # the event_key column (VARBINARY(1020))
MAX_BATCH_RACE_REDOS = 5  # batch mode on MySQL: redos after a 1062 race before it is an outage
# Test seam (batch mode): MySQL: called after the batch's duplicate-finding SELECT ... FOR
# UPDATE, before the multi-row INSERT; MariaDB: before the INSERT IGNORE ... RETURNING (the
# statement that finds them there). Tests monkeypatch it; never set in production.
_test_hook_after_batch_select: Callable[[], None] | None = None
IDLE_PING_SECONDS = 30.0  # ping a connection idle this long before using it (server timeouts)

# Errors that are the infrastructure's, not the record's (inbox/CONTRACT.md, "Attempts and
# outages"): lock wait timeout, deadlock (both roll the transaction back), read-only server
# (failover), shutdown, connection killed, client disconnected, and the client's codes of a
# refused or lost connection.
INFRASTRUCTURE_CODES = frozenset(
    {1205, 1213, 1290, 1836, 1053, 1077, 1927, 4031, 2002, 2003, 2006, 2013, 2055}
)

Handler = Callable[[pymysql.connections.Connection, Message], None]
"""``handler(tx, record)``: does the business change on ``tx``, the PyMySQL connection whose
transaction is open (never commit or roll it back). Raise any exception to fail the attempt;
an infrastructure error (:func:`is_infrastructure_error`, e.g. PyMySQL's deadlock error let
through, or raised ``from`` it) is not counted as an attempt: the record is redone."""


def is_infrastructure_error(error: BaseException) -> bool:
    """Whether ``error``, or an exception in its ``__cause__`` chain (``raise ... from``), means the
    database could not do the work rather than that the record is wrong: a PyMySQL error with
    code 1205, 1213, 1290, 1836, 1053, 1077, 1927, 4031, 2002, 2003, 2006, 2013 or 2055, PyMySQL's
    ``InterfaceError`` (a closed connection), or a ``ConnectionError``/``TimeoutError``. The
    first PyMySQL error of the chain decides. The inbox retries those without counting them as
    attempts, for at most ``outage_budget``."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, pymysql.err.InterfaceError):
            return True
        if isinstance(current, pymysql.err.MySQLError):
            code = current.args[0] if current.args else None
            return isinstance(code, int) and code in INFRASTRUCTURE_CODES
        if isinstance(current, (ConnectionError, TimeoutError)):
            return True
        current = current.__cause__
    return False


class Outcome(str, enum.Enum):
    """How a record was settled. Every outcome lets its offset be committed."""

    PROCESSED = "processed"
    """The handler's change was committed with the inbox row."""
    DUPLICATE = "duplicate"
    """The inbox already had ``(consumer, event_key)``: acknowledged, handler not run."""
    STALE = "stale"
    """Its version is not newer than the stored one: inbox row committed, handler not run."""
    PARKED = "parked"
    """Version gap under :attr:`GapPolicy.PARK`: stored in the parked table, handler not run."""
    RESUMED = "resumed"
    """A parked record applied by itself once the version before it was (handler run)."""
    DEAD_LETTERED = "dead_lettered"
    """Failed ``max_attempts`` times, or a poison record: sent to the dead-letter topic."""
    RETRIED = "retried"
    """Its attempts were used up and a copy of it was sent to the next retry tier's topic
    (``InboxSettings.retry_tiers``; acknowledged before the outcome is reported)."""
    COMPENSATED = "compensated"
    """A parked record past its gap deadline handed to ``Hooks.on_gap_expired`` (instead of the
    dead-letter topic), which returned normally; its parked row was deleted."""


@dataclass(frozen=True)
class ProcessResult:
    """The result of :meth:`Inbox.process`."""

    outcome: Outcome
    event_key: str | None
    """The record's event key (``None`` when the header was missing or empty)."""
    attempts: int
    """Attempts counted for the record (0 when dead-lettered before any); attempts ended by an
    infrastructure error (:func:`is_infrastructure_error`) are not counted."""
    reason: str | None = None
    """Why it was dead-lettered or parked (the ``dlq_reason`` header), the last error
    (``retry_error``) of a retried one, else ``None``."""


@dataclass
class Hooks:
    """Callbacks around the database commit, for metrics, tracing (and the scenarios' crashes).

    ``before_commit(record)`` runs after the handler succeeded, right before the database commit;
    ``after_commit(record, result)`` after the transaction ended, for every outcome, before the
    Kafka offset may be committed. An exception from ``before_commit`` fails the attempt; one
    from ``after_commit`` propagates out of :meth:`Inbox.process`.

    ``on_gap_expired(record, parked_at)`` (default ``None``: dead-letter) replaces the dead letter
    of a parked record whose gap deadline passed (the compensation hook; ``parked_at`` is UTC
    ISO-8601 text). It runs in the sweep, outside any inbox transaction; when it returns
    normally the parked row is deleted and ``after_commit`` sees outcome ``compensated``; when it
    raises, the row stays and the next sweep calls it again.
    """

    before_commit: Callable[[Message], None] = field(default=lambda record: None)
    after_commit: Callable[[Message, ProcessResult], None] = field(
        default=lambda record, result: None
    )
    on_gap_expired: Callable[[Message, str], None] | None = None


class DeadLetterError(Exception):
    """A dead letter could not be produced: the consumer must stop (the record is unsettled)."""


class OutageError(Exception):
    """The record failed only with infrastructure errors (:func:`is_infrastructure_error`) for
    longer than ``outage_budget``. It is not settled: its offset, and those after it, must not be
    committed; a restarted consumer resumes with it. ``__cause__`` is the last error."""

    def __init__(self, topic: str, partition: int, offset: int, budget: float, error: str):
        super().__init__(
            f"database outage longer than the outage budget ({budget:g} s) at record "
            f"{topic}/{partition}@{offset}, not settled: {error}"
        )
        self.topic, self.partition, self.offset, self.budget = topic, partition, offset, budget


class _NoConnection(Exception):
    """``connect()`` failed: an infrastructure error whatever the cause."""


class _Poison(Exception):
    """A record that cannot be processed at all: dead-lettered at once."""


class _Park(Exception):
    """A version gap under the gap policy ``park`` (or ``dead_letter``): parked or dead-lettered."""

    def __init__(self, reason: str, key: tuple[str, str, int]):
        super().__init__(reason)
        self.key = key


class _HandlerFailed(Exception):
    """Batch mode: the handler (or ``before_commit``) of the record at ``position`` failed, or
    its version gap is not parked; ``__cause__`` is the error."""

    def __init__(self, position: int):
        super().__init__(f"record {position} of the batch failed")
        self.position = position


class _DuplicateRace(Exception):
    """Batch mode on MySQL: another transaction inserted one of the batch's keys between the
    ``SELECT ... FOR UPDATE`` and the ``INSERT`` (1062): the batch is redone."""


class _Item:
    """A record of a batch and what the batch attempt decided for it."""

    __slots__ = (
        "agg",
        "ended",
        "failure",
        "index",
        "key",
        "origin",
        "outcome",
        "raw_agg",
        "raw_key",
        "reason",
        "record",
        "span",
        "version",
    )

    def __init__(self, index, record, key, raw_key, version, span):
        self.index, self.record, self.key, self.raw_key = index, record, key, raw_key
        self.version, self.span = version, span
        self.origin = origin(record)  # (topic, partition, offset) for its inbox row
        self.failure: BaseException | None = None  # its handler's error in a failed batch run
        self.agg = self.raw_agg = None
        self.outcome: Outcome | None = None
        self.reason: str | None = None
        self.ended = False


def _decode(raw) -> str:
    return raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else str(raw)


class _StillAhead(Exception):
    """A parked record's version is still ahead of the stored one: it stays parked."""


@dataclass(frozen=True)
class ParkedSweep:
    """What one :meth:`Inbox.sweep_parked` did."""

    resumed: int = 0
    stale: int = 0
    dead_lettered: int = 0
    parked: int = 0
    """Rows still parked after the sweep."""
    oldest: float | None = None
    """Age in seconds of the oldest of them."""
    compensated: int = 0
    """Rows past their deadline handed to ``Hooks.on_gap_expired`` (instead of a dead letter)."""
    retried: int = 0
    """Resumed rows whose handler kept failing, sent to their next retry tier."""


class ParkedRecord:
    """A record rebuilt from the parked table, with the methods of a confluent-kafka ``Message``
    that handlers and hooks use (``topic()``, ``partition()``, ``offset()``, ``key()``,
    ``value()``, ``headers()``, ``error()``): what was received, where it was read."""

    def __init__(self, topic, partition, offset, key, value, headers):
        self._topic, self._partition, self._offset = topic, partition, offset
        self._key, self._value, self._headers = key, value, headers

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes | None]]:
        return list(self._headers)

    def error(self) -> None:
        return None


def encode_headers(headers) -> str:
    """Headers as the parked table stores them: ``[[name, base64 value or null], ...]``."""
    return json.dumps(
        [[k, None if v is None else base64.b64encode(v).decode("ascii")] for k, v in headers or ()]
    )


def decode_headers(text: str) -> list[tuple[str, bytes | None]]:
    """The inverse of :func:`encode_headers`; ``ValueError`` naming what is wrong."""
    items = json.loads(text)
    if not isinstance(items, list):
        raise ValueError("record_headers is not a JSON array")
    out = []
    for item in items:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
            raise ValueError("record_headers holds an item that is not a [name, value] pair")
        value = item[1]
        if value is not None and not isinstance(value, str):
            raise ValueError(f"record_headers: header {item[0]!r}: not base64 text")
        out.append((item[0], None if value is None else base64.b64decode(value, validate=True)))
    return out


class _Gap(Exception):
    """A version gap counted as a failed attempt (gap policy ``retry``)."""


def dead_letter_producer(config: dict) -> Producer:
    """A confluent-kafka ``Producer`` for dead letters: ``config`` (librdkafka properties, e.g.
    ``{"bootstrap.servers": "host:9092"}``) with ``acks=all`` and idempotence forced on."""
    return Producer({"linger.ms": 0, **config, "acks": "all", "enable.idempotence": True})


def _quote_table(name: str) -> str:
    return ".".join("`" + part.replace("`", "``") + "`" for part in name.split("."))


def _header(record: Message, name: str) -> bytes | None:
    """The value of the last header called ``name`` (``None`` when absent)."""
    value = None
    for key, raw in record.headers() or ():
        if key == name:
            value = raw
    return value


def _text(raw: bytes | None) -> str:
    return "" if raw is None else raw.decode("utf-8", errors="replace")


# The headers of a retry copy (inbox/CONTRACT.md, "Retry tiers").
HEADER_RETRY_COUNT = "retry_count"
HEADER_RETRY_AT = "retry_at"
HEADER_ORIGINAL_TOPIC = "original_topic"
HEADER_ORIGINAL_PARTITION = "original_partition"
HEADER_ORIGINAL_OFFSET = "original_offset"
HEADER_RETRY_ERROR = "retry_error"
HEADER_RETRY_HISTORY = "retry_history"
_RETRY_HEADERS = (
    HEADER_RETRY_COUNT,
    HEADER_RETRY_AT,
    HEADER_ORIGINAL_TOPIC,
    HEADER_ORIGINAL_PARTITION,
    HEADER_ORIGINAL_OFFSET,
    HEADER_RETRY_ERROR,
    HEADER_RETRY_HISTORY,
)


def origin(record: Message) -> tuple[str, int, int]:
    """Where the first record of a retry copy was (its ``original_topic``,
    ``original_partition``, ``original_offset`` headers), or the record's own topic, partition
    and offset when it is not a copy (or those headers are not readable)."""
    own = (record.topic(), record.partition(), record.offset())
    topic = _header(record, HEADER_ORIGINAL_TOPIC)
    partition = _text(_header(record, HEADER_ORIGINAL_PARTITION)).strip()
    offset = _text(_header(record, HEADER_ORIGINAL_OFFSET)).strip()
    if not topic or not _DECIMAL.fullmatch(partition) or not _DECIMAL.fullmatch(offset):
        return own
    return _text(topic), int(partition), int(offset)


def retry_tier(record: Message) -> int:
    """The retry tier a record is in: its ``retry_count`` header, 0 when absent (not a copy) or
    not an integer."""
    text = _text(_header(record, HEADER_RETRY_COUNT)).strip()
    if not _DECIMAL.fullmatch(text) or int(text) < 0:
        return 0
    return int(text)


def retry_at(record: Message) -> float | None:
    """When a retry copy may be processed (its ``retry_at`` header, as seconds since the epoch),
    ``None`` for a record without a readable one."""
    if retry_tier(record) == 0:
        return None
    text = _text(_header(record, HEADER_RETRY_AT)).strip()
    if not _DECIMAL.fullmatch(text):
        return None
    return int(text) / 1000.0


class Inbox:
    """Processes records at most once per ``(consumer, event_key)``.

    ``connect`` opens a new PyMySQL connection to the consumer's database (e.g.
    ``functools.partial(pymysql.connect, host=..., database=...)``); the inbox keeps one open and
    reconnects after a connection error. ``producer`` sends dead letters (see
    :func:`dead_letter_producer`). Not thread-safe: one inbox per poll loop.

    Each record is processed inside an OpenTelemetry consumer span ``"<topic> process"`` whose
    parent is the trace context of the record's W3C ``traceparent``/``tracestate`` headers
    (inbox/CONTRACT.md, "Trace context"); the handler runs with that span current, so its own
    spans join the producer's trace. ``tracer_provider``: default the global one
    (``opentelemetry.trace.set_tracer_provider``; none installed: no-op spans). ``propagator``:
    default ``TraceContextTextMapPropagator()`` (W3C, what the relay writes).
    ``consumer_group`` is the span's ``messaging.consumer.group.name`` (default: the consumer
    name; :class:`InboxRunner` sets it to its ``group.id``).

    With ``settings.metrics_registry`` set, every settled record (those the sweep resumes,
    compensates or dead-letters included) counts in ``outbox_inbox_records_total{consumer,
    topic, outcome}`` (``topic``: the original topic of a retry copy), and each
    :meth:`sweep_parked` sets ``outbox_inbox_parked_records`` and
    ``outbox_inbox_parked_oldest_seconds`` (see :mod:`outbox_inbox.metrics`).
    """

    def __init__(
        self,
        settings: InboxSettings,
        connect: Callable[[], pymysql.connections.Connection],
        producer: Producer,
        hooks: Hooks | None = None,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        propagator: TextMapPropagator | None = None,
        consumer_group: str | None = None,
    ) -> None:
        self.settings = settings
        self.hooks = hooks or Hooks()
        self.consumer_group = consumer_group or settings.consumer
        self._tracer = trace.get_tracer(INSTRUMENTATION_NAME, tracer_provider=tracer_provider)
        self._propagator = propagator or TraceContextTextMapPropagator()
        self._connect = connect
        self._producer = producer
        self._conn: pymysql.connections.Connection | None = None
        self._last_used = 0.0
        self._mariadb: bool | None = None  # the server's flavor, read once (batch mode)
        self.metrics: InboxMetrics | None = (
            None
            if settings.metrics_registry is None
            else InboxMetrics(settings.metrics_registry, settings.consumer)
        )
        inbox, versions = _quote_table(settings.inbox_table), _quote_table(settings.version_table)
        self._sql_insert = (
            f"INSERT INTO {inbox} (consumer, event_key, topic, kafka_partition, kafka_offset)"
            " VALUES (%s, %s, %s, %s, %s)"
        )
        self._sql_version = (
            f"SELECT version FROM {versions}"
            " WHERE consumer = %s AND aggregate_type = %s AND aggregate_id = %s FOR UPDATE"
        )
        self._sql_upsert = (
            f"INSERT INTO {versions} (consumer, aggregate_type, aggregate_id, version)"
            " VALUES (%s, %s, %s, %s) ON DUPLICATE KEY UPDATE version = VALUES(version)"
        )
        self._sql_batch_insert = (
            f"INSERT INTO {inbox} (consumer, event_key, topic, kafka_partition, kafka_offset)"
            " VALUES "
        )
        self._sql_batch_insert_ignore = (
            f"INSERT IGNORE INTO {inbox} (consumer, event_key, topic, kafka_partition,"
            " kafka_offset) VALUES "
        )
        self._sql_batch_existing = (
            f"SELECT event_key FROM {inbox} WHERE consumer = %s AND event_key IN ("
        )
        self._sql_batch_uninsert = f"DELETE FROM {inbox} WHERE consumer = %s AND event_key IN ("
        self._sql_batch_versions = (
            f"SELECT aggregate_type, aggregate_id, version FROM {versions}"
            " WHERE consumer = %s AND (aggregate_type, aggregate_id) IN ("
        )
        self._sql_batch_upsert_head = (
            f"INSERT INTO {versions} (consumer, aggregate_type, aggregate_id, version) VALUES "
        )
        self._sql_stored = (
            f"SELECT version FROM {versions}"
            " WHERE consumer = %s AND aggregate_type = %s AND aggregate_id = %s"
        )
        parked = _quote_table(settings.parked_table)
        columns = (
            "aggregate_type, aggregate_id, version, topic, kafka_partition, kafka_offset,"
            " record_key, record_value, record_headers,"
            " DATE_FORMAT(CONVERT_TZ(parked_at, @@session.time_zone, '+00:00'),"
            " '%%Y-%%m-%%dT%%H:%%i:%%s.%%fZ'), expires_at < NOW(6)"
        )
        self._sql_park = (
            f"INSERT IGNORE INTO {parked} (consumer, aggregate_type, aggregate_id, version,"
            " event_key, topic, kafka_partition, kafka_offset, record_key, record_value,"
            " record_headers, reason, expires_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s,"
            " %s, %s, %s, DATE_ADD(NOW(6), INTERVAL %s MICROSECOND))"
        )
        self._sql_parked_one = (
            f"SELECT {columns} FROM {parked} WHERE consumer = %s AND aggregate_type = %s"
            " AND aggregate_id = %s AND version = %s"
        )
        self._sql_parked_due = (
            f"SELECT {columns} FROM {parked} WHERE consumer = %s ORDER BY expires_at LIMIT 100"
        )
        self._sql_unpark = (
            f"DELETE FROM {parked} WHERE consumer = %s AND aggregate_type = %s"
            " AND aggregate_id = %s AND version = %s"
        )
        self._sql_batch_park = (
            f"INSERT IGNORE INTO {parked} (consumer, aggregate_type, aggregate_id, version,"
            " event_key, topic, kafka_partition, kafka_offset, record_key, record_value,"
            " record_headers, reason, expires_at) VALUES "
        )
        self._sql_batch_successors = (
            f"SELECT aggregate_type, aggregate_id FROM {parked} WHERE consumer = %s"
            " AND (aggregate_type, aggregate_id, version) IN ("
        )
        self._sql_parked_stats = (
            f"SELECT COUNT(*), TIMESTAMPDIFF(MICROSECOND, MIN(parked_at), NOW(6)) FROM {parked}"
            " WHERE consumer = %s"
        )

    def process(self, record: Message, handler: Handler) -> ProcessResult:
        """Settle one record (see :meth:`_process_one`), then apply its aggregate's parked
        successors when it was processed with a version (inbox/CONTRACT.md, "Parked
        versions")."""
        return self._process_single(record, handler, None)

    def _process_single(self, record, handler: Handler, span, failure=None) -> ProcessResult:
        result = self._process_one(record, handler, None, span, failure)
        if result.outcome is Outcome.PROCESSED:
            key = self._version_key(record)
            if key is not None:
                self._resume_after(key, handler)
        return result

    def _version_key(self, record) -> tuple[str, str, int] | None:
        try:
            version = self._version(record)
        except _Poison:
            return None
        if version is None:
            return None
        agg_type = _text(_header(record, self.settings.aggregate_type_header))
        return (agg_type, _text(record.key()), version)

    def _resume_after(self, applied: tuple[str, str, int], handler: Handler) -> None:
        """Applies the parked successors of ``applied``, one at a time, in version order."""
        agg_type, agg_id, version = applied
        while True:
            try:
                row = self._query_one(
                    self._sql_parked_one, (self.settings.consumer, agg_type, agg_id, version + 1)
                )
            except Exception as error:  # left for the sweep
                log.warning("parked successors not read (the sweep resumes them): %s", error)
                return
            if row is None:
                return
            record, key, _, _ = self._parked_row(row)
            if self._process_one(record, handler, key).outcome is not Outcome.RESUMED:
                return
            version += 1

    def sweep_parked(self, handler: Handler) -> ParkedSweep:
        """One sweep of the parked table (inbox/CONTRACT.md, "Parked versions", the sweep): of the
        100 rows that expire first, one whose predecessor has been applied is applied (with its
        successors), one no newer than the applied version is removed, one past its deadline is
        dead-lettered and removed. Raises PyMySQL's error when the tables cannot be read (sweep
        again later) and what :meth:`process` raises."""
        s = self.settings
        resumed = stale = dead = compensated = retried = 0
        for row in self._query_all(self._sql_parked_due, (s.consumer,)):
            record, key, parked_at, expired = self._parked_row(row)
            stored_row = self._query_one(self._sql_stored, (s.consumer, key[0], key[1]))
            stored = None if stored_row is None else int(stored_row[0])
            if stored is None or key[2] <= stored + 1:
                outcome = self._process_one(record, handler, key).outcome
                if outcome is Outcome.RESUMED:
                    resumed += 1
                    self._resume_after(key, handler)
                elif outcome in (Outcome.STALE, Outcome.DUPLICATE):
                    stale += 1
                elif outcome is Outcome.DEAD_LETTERED:
                    dead += 1
                elif outcome is Outcome.RETRIED:
                    retried += 1
            elif expired:
                reason = (
                    f"version gap: expected {stored + 1}, got {key[2]}; parked since {parked_at}"
                )
                event_key = _text(_header(record, s.event_key_header))
                if self.hooks.on_gap_expired is not None:
                    try:
                        self.hooks.on_gap_expired(record, parked_at)
                    except Exception as error:  # the row stays: the next sweep calls it again
                        log.warning(
                            "event_key %s: on_gap_expired failed (next sweep again): %s",
                            event_key,
                            error,
                        )
                        continue
                    self._execute(self._sql_unpark, (s.consumer, *key))
                    self._count(record, Outcome.COMPENSATED)
                    self.hooks.after_commit(
                        record, ProcessResult(Outcome.COMPENSATED, event_key, 0, reason)
                    )
                    compensated += 1
                    continue
                result = self._dead_letter(
                    record,
                    event_key,
                    Outcome.DEAD_LETTERED,
                    reason,
                    0,
                )
                self._execute(self._sql_unpark, (s.consumer, *key))
                self._count(record, result.outcome)
                self.hooks.after_commit(record, result)
                dead += 1
        count, oldest_us = self._query_one(self._sql_parked_stats, (s.consumer,)) or (0, None)
        if self.metrics is not None:
            self.metrics.parked(int(count), None if oldest_us is None else oldest_us / 1e6)
        return ParkedSweep(
            resumed,
            stale,
            dead,
            int(count),
            None if oldest_us is None else oldest_us / 1e6,
            compensated,
            retried,
        )

    def _parked_row(self, row):
        agg_type, agg_id, version, topic, partition, offset, key, value, headers = row[:9]
        record = ParkedRecord(
            topic, int(partition), int(offset), key, value, decode_headers(headers)
        )
        text = lambda b: b.decode("utf-8") if isinstance(b, (bytes, bytearray)) else str(b)  # noqa: E731
        return record, (text(agg_type), text(agg_id), int(version)), row[9], bool(row[10])

    def _own_connection(self) -> pymysql.connections.Connection:
        if self._conn is None:
            self._conn = self._connect()
            self._conn.autocommit(False)
        return self._conn

    def _query_one(self, sql, params):
        conn = self._own_connection()
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params)
                row = cur.fetchone()
            conn.commit()
            return row
        except Exception:
            self._rollback()
            raise

    def _query_all(self, sql, params):
        conn = self._own_connection()
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params)
                rows = list(cur.fetchall())
            conn.commit()
            return rows
        except Exception:
            self._rollback()
            raise

    def _execute(self, sql, params) -> None:
        conn = self._own_connection()
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params)
            conn.commit()
        except Exception:
            self._rollback()
            raise

    def _park(self, record, key: str, vkey: tuple[str, str, int], reason: str) -> bool:
        """Under the version row's lock, still a gap: store the record (True); the gap closed
        meanwhile: False (redo the attempt)."""
        s = self.settings
        conn = self._own_connection()
        conn.begin()
        with conn.cursor() as cur:
            cur.execute(self._sql_version, (s.consumer, vkey[0], vkey[1]))
            row = cur.fetchone()
            if row is None or vkey[2] <= int(row[0]) + 1:
                conn.rollback()
                return False
            cur.execute(
                self._sql_park,
                (
                    s.consumer,
                    vkey[0],
                    vkey[1],
                    vkey[2],
                    key,
                    record.topic(),
                    record.partition(),
                    record.offset(),
                    record.key(),
                    record.value(),
                    encode_headers(record.headers()),
                    reason[:512],
                    int(self._topic_settings(record).gap_deadline * 1_000_000),
                ),
            )
        conn.commit()
        return True

    def _process_one(
        self, record, handler: Handler, parked, span=None, failure=None
    ) -> ProcessResult:
        """Settle one record: run ``handler`` in a transaction with its inbox row, retrying with
        exponential backoff, or dead-letter it. Blocks until settled (retries included).

        Handler errors and data errors (a version gap under ``retry``) count toward
        ``max_attempts``; when they are used up the record goes to its next retry tier
        (``InboxSettings.retry_tiers``: a copy on the tier's topic, outcome ``retried``) or, after
        the last one, to the dead-letter topic. A retry copy is processed like any record (its
        inbox row names the original record); this does not wait for its ``retry_at``: the
        :class:`InboxRunner` does (with your own poll loop, check :func:`retry_at`).
        Infrastructure errors (:func:`is_infrastructure_error`) are retried with the same backoff
        without counting, for at most ``outage_budget``, and never send a record to a tier.

        Returns the :class:`ProcessResult`; afterwards ``record.offset() + 1`` may be committed.
        Raises :class:`DeadLetterError` when a dead letter (or a retry copy) cannot be produced,
        :class:`OutageError` when the database stayed unreachable longer than the outage budget
        (the record is then not settled: stop without committing its offset), and whatever
        ``hooks.after_commit`` raises.

        Runs inside the record's consumer span (see :class:`Inbox`): its status is ERROR for a
        parked or dead-lettered record and when this raises.

        ``failure``: the handler's error of a batch run that failed at this record; it is the
        record's attempt 1, and the attempts go on from there.
        """
        if span is None:
            span = self._start_span(record)
        with trace.use_span(
            span, end_on_exit=True, record_exception=False, set_status_on_exception=False
        ):
            try:
                result = self._settle(record, handler, parked, failure)
            except Exception as error:
                self._unsettled(span, error)
                raise
            self._report(record, result, span)
            return result

    def _start_span(self, record) -> trace.Span:
        """The record's consumer span (not yet current, not ended), with its attributes."""
        context = self._propagator.extract(record.headers() or [], getter=HEADERS_GETTER)
        span = self._tracer.start_span(
            f"{record.topic()} process", context=context, kind=SpanKind.CONSUMER
        )
        if span.is_recording():
            key = _text(_header(record, self.settings.event_key_header)) or None
            span.set_attributes(
                span_attributes(record, self.settings.consumer, self.consumer_group, key)
            )
        return span

    @staticmethod
    def _unsettled(span: trace.Span, error: BaseException) -> None:
        span.set_attribute("inbox.outcome", "unsettled")
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, str(error)))

    def _report(self, record, result: ProcessResult, span: trace.Span, topic=None) -> None:
        """A settled record: its span's outcome, the metric (``topic``: its original topic,
        when known), ``after_commit``."""
        span.set_attributes(
            {"inbox.outcome": result.outcome.value, "inbox.attempts": result.attempts}
        )
        if result.outcome is Outcome.DEAD_LETTERED:
            span.set_status(Status(StatusCode.ERROR, result.reason))
        if self.metrics is not None:
            self.metrics.settled(topic or origin(record)[0], result.outcome.value)
        try:
            self.hooks.after_commit(record, result)
        except Exception as error:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, str(error)))
            raise

    def process_batch(self, records: Sequence[Message], handler: Handler) -> list[ProcessResult]:
        """Settle ``records`` (in their order, e.g. one poll's) in one database transaction: batch
        mode (inbox/CONTRACT.md, "Batch mode"), with the guarantees of :meth:`process`.

        Returns one :class:`ProcessResult` per record, **in input order**, each what
        :meth:`process` would have returned for it; each record's inbox row, version row,
        parked row, hooks, metric and consumer span are those :meth:`process` produces.
        Afterwards the offset after each record may be committed.

        1. A record without ``event_key``, with an invalid version or with an ``event_key``
           longer than 1,020 bytes goes through :meth:`process` first (its dead letter). A
           second record with the same ``event_key`` (compared as UTF-8 bytes) is a duplicate.
        2. One transaction: the inbox rows in one statement (MariaDB: ``INSERT IGNORE ...
           RETURNING event_key``; MySQL: ``SELECT ... FOR UPDATE`` of the keys, then a multi-row
           ``INSERT`` of the new ones, redone at once when another transaction inserted one
           meanwhile (1062), at most 5 times in a row), the versions in one ``SELECT ... FOR
           UPDATE`` and one multi-row upsert (stale and parked records as in :meth:`process`),
           the handler per new record with the transaction (``tx``), ``before_commit`` per
           record, commit, ``after_commit`` per record; then the parked successors of the
           aggregates whose version moved are applied (outcome ``resumed``, through the hooks).
        3. A handler error (not an infrastructure error) at record ``i``: rolled back; records
           before ``i`` are processed again as a batch, record ``i`` alone by :meth:`process`
           (its attempts, retry tier, dead letter), the records after it as a new batch. A
           version gap under the gap policy ``dead_letter`` or ``retry`` is handled the same way.
        4. An infrastructure error (:func:`is_infrastructure_error`; in a statement, a handler or
           the commit): rolled back and the batch redone after the backoff, within
           ``outage_budget`` counted from the batch's first such error.

        The handler runs inside the batch's transaction: a slow handler delays the whole batch.
        Raises :class:`OutageError` (naming the batch's first record) when the budget runs out:
        then no record of the batch may be counted settled (commit none of their offsets);
        :class:`DeadLetterError` and what ``hooks.after_commit`` raises, like :meth:`process`.
        """
        records = list(records)
        results: list[ProcessResult | None] = [None] * len(records)
        s = self.settings
        items: list[_Item] = []
        for index, record in enumerate(records):
            key = _text(_header(record, s.event_key_header))
            single = not key
            version = None
            if not single:
                try:
                    version = self._version(record)
                except _Poison:
                    single = True
            raw_key = key.encode("utf-8")
            if single or len(raw_key) > MAX_EVENT_KEY_BYTES:
                results[index] = self._process_single(record, handler, None)
                continue
            item = _Item(index, record, key, raw_key, version, self._start_span(record))
            if version is not None:
                agg_type = _text(_header(record, s.aggregate_type_header))
                item.agg = (agg_type, _text(record.key()))
                item.raw_agg = (agg_type.encode("utf-8"), item.agg[1].encode("utf-8"))
            items.append(item)
        try:
            self._batch(items, handler, results)
        except BaseException as error:
            for item in items:
                if not item.ended:
                    item.ended = True
                    self._unsettled(item.span, error)
                    item.span.end()
            raise
        return results  # type: ignore[return-value]

    def _batch(self, items: list[_Item], handler: Handler, results: list) -> None:
        """Settle ``items`` as one batch, split at a record whose handler fails (step 5)."""
        while items:
            failed = self._batch_transaction(items, handler, results)
            if failed is None:
                return
            self._batch(items[:failed], handler, results)
            item = items[failed]
            item.ended = True  # the single path ends its span
            # The failed batch run is its attempt 1 (CONTRACT "Batch mode" 5).
            results[item.index] = self._process_single(
                item.record, handler, item.span, item.failure
            )
            items = items[failed + 1 :]

    def _batch_transaction(self, items: list[_Item], handler: Handler, results: list) -> int | None:
        """One batch in one transaction, redone after infrastructure errors (within the outage
        budget) and after a MySQL duplicate-key race (at once, at most 5 times in a row).
        ``None`` when settled (results set, hooks called, successors resumed), else the
        position of the record whose handler failed (rolled back)."""
        s = self.settings
        t = self._topic_settings(items[0].record)
        outage_since: float | None = None
        outage_retries = 0
        races = 0
        while True:
            try:
                moved = self._batch_attempt(items, handler)
            except _HandlerFailed as failed:
                self._rollback()
                # A handler's error (its cause) is the record's attempt 1; a version gap (no
                # cause) is not: the single path finds it again as its own attempt 1.
                items[failed.position].failure = failed.__cause__
                if log.isEnabledFor(logging.DEBUG):
                    log.debug(
                        "event_key %s: batch handler failed (%s); record alone",
                        items[failed.position].key,
                        failed.__cause__,
                    )
                return failed.position
            except Exception as error:
                self._rollback()
                race = isinstance(error, _DuplicateRace)
                if race:
                    races += 1
                    if races <= MAX_BATCH_RACE_REDOS:
                        log.info("batch: %s; redoing the batch", error)
                        continue
                elif not (isinstance(error, _NoConnection) or is_infrastructure_error(error)):
                    # A statement of the inbox's own failed for no known reason: the first
                    # record goes alone through the single path (which counts its attempts).
                    log.warning("batch: %s; first record alone", error)
                    return 0
                races = 0
                reason = str(error) or type(error).__name__
                for item in items:
                    item.span.add_event(
                        "exception",
                        {
                            "exception.type": type(error).__name__,
                            "exception.message": reason,
                            "inbox.attempt": 1,
                            "inbox.outage": True,
                        },
                    )
                now = time.monotonic()
                if outage_since is None:
                    outage_since, outage_retries = now, 0
                down = now - outage_since
                first = items[0].record
                if down >= s.outage_budget:
                    log.error(
                        "batch of %d from event_key %s: database outage longer than the outage"
                        " budget (%.3fs): %s; stopping",
                        len(items),
                        items[0].key,
                        s.outage_budget,
                        reason,
                    )
                    raise OutageError(
                        first.topic(), first.partition(), first.offset(), s.outage_budget, reason
                    ) from error
                outage_retries += 1
                delay = min(
                    backoff_delay(outage_retries, t.backoff_initial, t.backoff_max),
                    s.outage_budget - down,
                )
                log.warning(
                    "batch of %d from event_key %s: infrastructure error (not an attempt; down"
                    " %.3fs): %s; retrying in %.3fs",
                    len(items),
                    items[0].key,
                    down,
                    reason,
                    delay,
                )
                time.sleep(delay)
                continue
            for item in items:
                result = ProcessResult(item.outcome or Outcome.PROCESSED, item.key, 1, item.reason)
                results[item.index] = result
            for item in items:
                item.ended = True
                try:
                    self._report(item.record, results[item.index], item.span, item.origin[0])
                finally:
                    item.span.end()
            if moved:
                self._resume_moved(moved, handler)
            return None

    def _begin(self) -> pymysql.connections.Connection:
        """The inbox's connection (opened, or pinged when idle), a transaction begun."""
        if self._conn is None:
            try:
                conn = self._connect()
            except Exception as error:
                raise _NoConnection(f"cannot connect to the database: {error}") from error
            self._conn = conn
            self._conn.autocommit(False)
        elif time.monotonic() - self._last_used > IDLE_PING_SECONDS:
            self._conn.ping(reconnect=True)
        self._last_used = time.monotonic()
        if self._mariadb is None:
            with self._conn.cursor() as cur:
                cur.execute("SELECT VERSION()")
                self._mariadb = "mariadb" in str(cur.fetchone()[0]).lower()
        self._conn.begin()
        return self._conn

    def _batch_attempt(self, items: list[_Item], handler: Handler) -> dict:
        """Steps 2-4 of batch mode, committed; the aggregates whose version moved -> their new
        version. Sets each item's outcome (``None``: processed) and reason."""
        s = self.settings
        conn = self._begin()
        cur = conn.cursor()
        fresh: list[_Item] = []
        seen: set[bytes] = set()
        for item in items:
            item.outcome = item.reason = None
            if item.raw_key in seen:
                item.outcome = Outcome.DUPLICATE
            else:
                seen.add(item.raw_key)
                fresh.append(item)
        rows = "(%s, %s, %s, %s, %s)"
        params: list = []
        for item in fresh:
            params += (s.consumer, item.key, *item.origin)
        if self._mariadb:
            if _test_hook_after_batch_select is not None:
                _test_hook_after_batch_select()
            cur.execute(
                self._sql_batch_insert_ignore
                + ", ".join([rows] * len(fresh))
                + " RETURNING event_key",
                params,
            )
            new = {row[0] for row in cur.fetchall()}
        else:
            cur.execute(
                self._sql_batch_existing + ", ".join(["%s"] * len(fresh)) + ") FOR UPDATE",
                [s.consumer, *(item.key for item in fresh)],
            )
            found = {row[0] for row in cur.fetchall()}
            if _test_hook_after_batch_select is not None:
                _test_hook_after_batch_select()
            new = {item.raw_key for item in fresh if item.raw_key not in found}
            if new:
                params = []
                for item in fresh:
                    if item.raw_key in new:
                        params += (s.consumer, item.key, *item.origin)
                try:
                    cur.execute(self._sql_batch_insert + ", ".join([rows] * len(new)), params)
                except pymysql.err.IntegrityError as error:
                    if error.args and error.args[0] == ER_DUP_ENTRY:
                        raise _DuplicateRace(
                            f"another transaction inserted a key: {error}"
                        ) from error
                    raise
        inserted = []
        for item in fresh:
            if item.raw_key in new:
                inserted.append(item)
            else:
                item.outcome = Outcome.DUPLICATE
        moved = self._batch_versions(cur, items, inserted)
        for position, item in enumerate(items):
            if item.outcome is not None:
                continue
            try:
                with trace.use_span(
                    item.span,
                    end_on_exit=False,
                    record_exception=False,
                    set_status_on_exception=False,
                ):
                    handler(conn, item.record)
            except Exception as error:
                if is_infrastructure_error(error):
                    raise
                raise _HandlerFailed(position) from error
        if moved:
            cur.execute(
                self._sql_batch_upsert_head
                + ", ".join(["(%s, %s, %s, %s)"] * len(moved))
                + " ON DUPLICATE KEY UPDATE version = VALUES(version)",
                [
                    v
                    for (agg_type, agg_id), version in moved.items()
                    for v in (s.consumer, agg_type, agg_id, version)
                ],
            )
        cur.close()
        for position, item in enumerate(items):
            if item.outcome is None:
                try:
                    self.hooks.before_commit(item.record)
                except Exception as error:
                    if is_infrastructure_error(error):
                        raise
                    raise _HandlerFailed(position) from error
        conn.commit()
        return moved

    def _batch_versions(self, cur, items: list[_Item], inserted: list[_Item]) -> dict:
        """Step 3: the stored versions of the batch's aggregates locked in one statement, each
        new record checked in batch order in memory (stale, parked, gap); returns the moved
        aggregates -> new version (text keys)."""
        s = self.settings
        versioned = [item for item in inserted if item.version is not None]
        if not versioned:
            return {}
        aggs = list(dict.fromkeys(item.raw_agg for item in versioned))
        cur.execute(
            self._sql_batch_versions + ", ".join(["(%s, %s)"] * len(aggs)) + ") FOR UPDATE",
            [s.consumer, *(part for agg in aggs for part in agg)],
        )
        applied: dict[tuple[bytes, bytes], int] = {
            (bytes(row[0]), bytes(row[1])): int(row[2]) for row in cur.fetchall()
        }
        moved: dict[tuple[str, str], int] = {}
        parked: list[_Item] = []
        for item in versioned:
            stored = applied.get(item.raw_agg)
            if stored is not None and item.version <= stored:
                item.outcome = Outcome.STALE
            elif stored is not None and item.version > stored + 1:
                reason = f"version gap: expected {stored + 1}, got {item.version}"
                if self._topic_settings(item.record).gap_policy is not GapPolicy.PARK:
                    # Through the single path, which dead-letters it or counts the attempt.
                    raise _HandlerFailed(items.index(item))
                item.outcome, item.reason = Outcome.PARKED, reason
                parked.append(item)
            else:
                applied[item.raw_agg] = item.version
                moved[item.agg] = item.version
        if parked:
            # A parked record has no inbox row (the single path rolls its insert back).
            cur.execute(
                self._sql_batch_uninsert + ", ".join(["%s"] * len(parked)) + ")",
                [s.consumer, *(item.key for item in parked)],
            )
            params: list = []
            for item in parked:
                r = item.record
                params += (
                    s.consumer,
                    *item.agg,
                    item.version,
                    item.key,
                    r.topic(),
                    r.partition(),
                    r.offset(),
                    r.key(),
                    r.value(),
                    encode_headers(r.headers()),
                    item.reason[:512],
                    int(self._topic_settings(r).gap_deadline * 1_000_000),
                )
            cur.execute(
                self._sql_batch_park
                + ", ".join(
                    [
                        "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,"
                        " DATE_ADD(NOW(6), INTERVAL %s MICROSECOND))"
                    ]
                    * len(parked)
                ),
                params,
            )
            for item in parked:
                log.info("event_key %s parked: %s", item.key, item.reason)
        return moved

    def _resume_moved(self, moved: dict, handler: Handler) -> None:
        """After a batch's commit: the parked successors of the aggregates whose version moved,
        found in one statement, applied one aggregate at a time in version order."""
        s = self.settings
        aggs = list(moved.items())
        try:
            rows = self._query_all(
                self._sql_batch_successors + ", ".join(["(%s, %s, %s)"] * len(aggs)) + ")",
                [
                    s.consumer,
                    *(p for (agg_type, agg_id), v in aggs for p in (agg_type, agg_id, v + 1)),
                ],
            )
        except Exception as error:  # left for the sweep
            log.warning("parked successors not read (the sweep resumes them): %s", error)
            return
        waiting = {(_decode(row[0]), _decode(row[1])) for row in rows}
        for agg, version in aggs:
            if agg in waiting:
                self._resume_after((*agg, version), handler)

    @property
    def parks(self) -> bool:
        """Whether gaps may be parked (versions checked, gap policy ``park`` consumer-wide or for
        a topic): the runner sweeps."""
        return self.settings.checks_versions and any(
            e.gap_policy is GapPolicy.PARK for e in self.settings.all_effective
        )

    def _topic_settings(self, record) -> EffectiveSettings:
        """The settings of ``record``'s topic: its original topic for a retry copy."""
        return self.settings.for_topic(origin(record)[0])

    def _count(self, record, outcome: Outcome) -> None:
        """Count a settled record in ``outbox_inbox_records_total`` (when metrics are on)."""
        if self.metrics is not None:
            self.metrics.settled(origin(record)[0], outcome.value)

    def close(self) -> None:
        """Close the database connection and flush the dead-letter producer."""
        if self._conn is not None:
            self._drop_connection()
        self._producer.flush(10)

    def _settle(self, record, handler: Handler, parked=None, failure=None) -> ProcessResult:
        s = self.settings
        t = self._topic_settings(record)
        key = _text(_header(record, s.event_key_header))
        if not key:
            return self._dead_letter_parked(record, None, "missing event_key header", 0, parked)
        try:
            version = self._version(record)
        except _Poison as poison:
            return self._dead_letter_parked(record, key, str(poison), 0, parked)

        attempt = 0  # attempts that count: not those ended by an infrastructure error
        outage_since: float | None = None  # since when the record fails with those only
        outage_retries = 0
        while True:
            try:
                if failure is not None:  # attempt 1 was a batch run's
                    error, failure = failure, None
                    raise error
                outcome = self._attempt(record, key, version, handler, parked)
                if outcome is Outcome.DUPLICATE and parked is not None:
                    # Applied before (a redelivery was processed): not parked any more.
                    self._execute(self._sql_unpark, (s.consumer, *parked))
            except _StillAhead:
                return ProcessResult(Outcome.PARKED, key, attempt + 1)
            except _Park as gap:
                if t.gap_policy is GapPolicy.DEAD_LETTER:
                    return self._dead_letter(
                        record, key, Outcome.DEAD_LETTERED, str(gap), attempt + 1
                    )
                try:
                    if self._park(record, key, gap.key, str(gap)):
                        return ProcessResult(Outcome.PARKED, key, attempt + 1, str(gap))
                    continue  # the gap closed meanwhile: redo the attempt
                except Exception as error:
                    self._rollback()
                    if not is_infrastructure_error(error):
                        raise
                    log.warning("event_key %s: parking failed (%s); retrying", key, error)
                    time.sleep(backoff_delay(1, t.backoff_initial, t.backoff_max))
                    continue
            except Exception as error:
                self._rollback()
                reason = str(error) or type(error).__name__
                if isinstance(error, _NoConnection) or (
                    not isinstance(error, _Gap) and is_infrastructure_error(error)
                ):
                    # Not an attempt: the record is redone once the database answers.
                    trace.get_current_span().record_exception(
                        error, {"inbox.attempt": attempt + 1, "inbox.outage": True}
                    )
                    now = time.monotonic()
                    if outage_since is None:
                        outage_since, outage_retries = now, 0
                    down = now - outage_since
                    if down >= s.outage_budget:
                        log.error(
                            "event_key %s: database outage longer than the outage budget "
                            "(%.3fs): %s; stopping",
                            key,
                            s.outage_budget,
                            reason,
                        )
                        raise OutageError(
                            record.topic(),
                            record.partition(),
                            record.offset(),
                            s.outage_budget,
                            reason,
                        ) from error
                    outage_retries += 1
                    delay = min(
                        backoff_delay(outage_retries, t.backoff_initial, t.backoff_max),
                        s.outage_budget - down,
                    )
                    log.warning(
                        "event_key %s: infrastructure error (not an attempt; down %.3fs): %s; "
                        "retrying in %.3fs",
                        key,
                        down,
                        reason,
                        delay,
                    )
                    time.sleep(delay)
                    continue
                outage_since = None
                attempt += 1
                trace.get_current_span().record_exception(error, {"inbox.attempt": attempt})
                if attempt >= t.max_attempts:
                    return self._exhausted(record, key, reason, attempt, parked)
                delay = backoff_delay(attempt, t.backoff_initial, t.backoff_max)
                log.warning(
                    "event_key %s: attempt %d of %d failed (%s); retrying in %.3fs",
                    key,
                    attempt,
                    t.max_attempts,
                    reason,
                    delay,
                )
                time.sleep(delay)
                continue
            if outcome is Outcome.PROCESSED and parked is not None:
                outcome = Outcome.RESUMED
            return ProcessResult(outcome, key, attempt + 1)

    def _dead_letter_parked(self, record, key, reason: str, attempts: int, parked):
        """Dead-letters ``record``; a parked one leaves the table once the letter is out."""
        result = self._dead_letter(record, key, Outcome.DEAD_LETTERED, reason, attempts)
        if parked is not None:
            try:
                self._execute(self._sql_unpark, (self.settings.consumer, *parked))
            except Exception as error:  # the sweep finds it again: a second letter at worst
                log.warning("a dead-lettered parked row could not be removed: %s", error)
        return result

    def _version(self, record: Message) -> int | None:
        s = self.settings
        if s.version_fn is not None:
            try:
                return s.version_fn(record)
            except Exception as error:
                raise _Poison(f"invalid version: {error}") from error
        if not s.version_header:
            return None
        raw = _header(record, s.version_header)
        if raw is None:
            return None  # an unversioned record: no check
        text = _text(raw)
        if not _DECIMAL.fullmatch(text):
            raise _Poison(f"invalid version header: {text}")
        return int(text)

    def _attempt(
        self, record, key: str, version: int | None, handler: Handler, parked=None
    ) -> Outcome:
        s = self.settings
        if self._conn is None:
            try:
                conn = self._connect()
            except Exception as error:
                # No connection at all: the infrastructure's, whatever the error.
                raise _NoConnection(f"cannot connect to the database: {error}") from error
            self._conn = conn
            self._conn.autocommit(False)
        elif time.monotonic() - self._last_used > IDLE_PING_SECONDS:
            self._conn.ping(reconnect=True)
        self._last_used = time.monotonic()
        conn = self._conn
        conn.begin()
        with conn.cursor() as cur:
            try:
                cur.execute(self._sql_insert, (s.consumer, key, *origin(record)))
            except pymysql.err.IntegrityError as error:
                if error.args and error.args[0] == ER_DUP_ENTRY:
                    conn.rollback()
                    return Outcome.DUPLICATE
                raise
            if version is not None:
                agg_type = _text(_header(record, s.aggregate_type_header))
                agg_id = _text(record.key())
                cur.execute(self._sql_version, (s.consumer, agg_type, agg_id))
                row = cur.fetchone()
                stored = None if row is None else int(row[0])
                if stored is not None and version <= stored:
                    if parked is not None:
                        cur.execute(self._sql_unpark, (s.consumer, *parked))
                    conn.commit()
                    return Outcome.STALE
                if stored is not None and version > stored + 1:
                    conn.rollback()
                    if parked is not None:
                        raise _StillAhead()
                    reason = f"version gap: expected {stored + 1}, got {version}"
                    if self._topic_settings(record).gap_policy is GapPolicy.RETRY:
                        raise _Gap(reason)
                    raise _Park(reason, (agg_type, agg_id, version))
                cur.execute(self._sql_upsert, (s.consumer, agg_type, agg_id, version))
        handler(conn, record)
        if parked is not None:
            with conn.cursor() as cur:
                cur.execute(self._sql_unpark, (s.consumer, *parked))
        self.hooks.before_commit(record)
        conn.commit()
        return Outcome.PROCESSED

    def _rollback(self) -> None:
        if self._conn is None:
            return
        try:
            self._conn.rollback()
        except Exception:  # the connection is broken: open a new one next attempt
            self._drop_connection()

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        with contextlib.suppress(Exception):
            conn.close()

    def _produce(self, topic: str, record: Message, headers, what: str) -> None:
        """Produce a copy of ``record`` with ``headers`` to ``topic`` (acks=all) and wait for the
        broker; :class:`DeadLetterError` when it is not acknowledged."""
        report: list[KafkaError | None] = []
        try:
            self._producer.produce(
                topic,
                value=record.value(),
                key=record.key(),
                headers=headers,
                on_delivery=lambda err, _msg: report.append(err),
            )
            while not report:  # librdkafka reports failure after message.timeout.ms at the latest
                self._producer.flush(1.0)
        except Exception as error:
            raise DeadLetterError(f"{what}: {error}") from error
        if report[0] is not None:
            raise DeadLetterError(f"{what}: {report[0]}")

    def _exhausted(self, record, key: str, reason: str, attempts: int, parked) -> ProcessResult:
        """Settle a record whose attempts are used up: a copy to the next retry tier of its
        original topic when one is left (outcome ``retried``), else the dead letter. A parked
        record's row is deleted once the copy or dead letter is acknowledged."""
        s = self.settings
        at = origin(record)
        tiers = s.for_topic(at[0]).retry_tiers
        n = retry_tier(record) + 1
        if n > len(tiers):
            return self._dead_letter_parked(record, key, reason, attempts, parked)
        now_ms = int(time.time() * 1000)
        history: list = []
        raw = _header(record, HEADER_RETRY_HISTORY)
        if raw is not None:
            with contextlib.suppress(ValueError):
                old = json.loads(_text(raw))
                if isinstance(old, list):
                    history = old
        history.append(
            {
                "topic": record.topic(),
                "partition": record.partition(),
                "offset": record.offset(),
                "attempts": attempts,
                "error": reason,
                "failed_at": now_ms,
            }
        )
        values = {
            HEADER_RETRY_COUNT: str(n),
            HEADER_RETRY_AT: str(now_ms + round(tiers[n - 1] * 1000)),
            HEADER_ORIGINAL_TOPIC: at[0],
            HEADER_ORIGINAL_PARTITION: str(at[1]),
            HEADER_ORIGINAL_OFFSET: str(at[2]),
            HEADER_RETRY_ERROR: reason,
            HEADER_RETRY_HISTORY: json.dumps(history, separators=(",", ":")),
        }
        headers = [(k, v) for k, v in record.headers() or () if k not in values]
        headers += [(k, values[k].encode()) for k in _RETRY_HEADERS]
        topic = s.retry_topic(at[0], n)
        self._produce(
            topic,
            record,
            headers,
            f"retry copy of {record.topic()}/{record.partition()}@{record.offset()} to {topic}",
        )
        if parked is not None:
            try:
                self._execute(self._sql_unpark, (s.consumer, *parked))
            except Exception as error:  # the sweep finds it again: a second copy at worst
                log.warning("a retried parked row could not be removed: %s", error)
        log.warning("event_key %s retried to %s (tier %d): %s", key, topic, n, reason)
        return ProcessResult(Outcome.RETRIED, key, attempts, reason)

    def _dead_letter(
        self, record: Message, key: str | None, outcome: Outcome, reason: str, attempts: int
    ) -> ProcessResult:
        """Produce the record to the dead-letter topic with acks=all and wait for the broker."""
        headers = list(record.headers() or [])
        # A retry copy's dead letter names the original record (its original_* headers).
        topic, partition, offset = origin(record)
        headers += [
            ("dlq_reason", reason.encode()),
            ("dlq_topic", topic.encode()),
            ("dlq_partition", str(partition).encode()),
            ("dlq_offset", str(offset).encode()),
            ("dlq_consumer", self.settings.consumer.encode()),
            ("dlq_attempts", str(attempts).encode()),
        ]
        self._produce(
            self.settings.dead_letter_topic, record, headers, f"dead letter for event_key {key}"
        )
        log.warning(
            "event_key %s %s to %s: %s", key, outcome.value, self.settings.dead_letter_topic, reason
        )
        return ProcessResult(outcome, key, attempts, reason)
