"""The scenario consumer of inbox/CONTRACT.md: the inbox with one fixed business handler.

Run as ``python -m outbox_inbox.examples.scenario_consumer`` with the ``INBOX_*`` environment
variables of the contract. Prints ``READY``, one ``OUTCOME`` line per settled record and, in
bench mode (``INBOX_EXIT_AFTER``), a ``BENCH`` line on stdout; logs go to stderr. Exit status:
0 after SIGTERM/SIGINT or ``INBOX_EXIT_AFTER`` records, 137 at the configured crash point, 1 on
an error.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time

import pymysql
from confluent_kafka import Message

from outbox_inbox import (
    Hooks,
    Inbox,
    InboxRunner,
    InboxSettings,
    Outcome,
    ProcessResult,
    dead_letter_producer,
    origin,
    retry_tier,
)

log = logging.getLogger("scenario_consumer")


def _env(name: str, default: str = "") -> str:
    return os.environ.get(name) or default


def _required(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise ValueError(f"{name} is required")
    return value


def _header_text(record: Message, name: str) -> str | None:
    value = None
    for key, raw in record.headers() or ():
        if key == name and raw is not None:
            value = raw.decode("utf-8", errors="replace")
    return value


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class BusinessHandler:
    """The contract's handler: one coupon row per record; ``poison``, ``fail_until_tier`` and
    ``fail_times``."""

    def __init__(self, consumer: str) -> None:
        self.consumer = consumer
        self.failures: dict[str, int] = {}  # event_key -> failures so far in this process

    def __call__(self, tx: pymysql.connections.Connection, record: Message) -> None:
        payload = json.loads(record.value() or b"null")
        if not isinstance(payload, dict):
            raise ValueError("payload is not a JSON object")
        event_key = _header_text(record, "event_key")
        try:
            version = int((_header_text(record, "version") or "").strip())
        except ValueError:
            version = None
        with tx.cursor() as cur:
            cur.execute(
                "INSERT INTO coupons (consumer, order_id, event_key, version)"
                " VALUES (%s, %s, %s, %s)",
                (self.consumer, (record.key() or b"").decode("utf-8"), event_key, version),
            )
        if payload.get("poison") is True:
            raise RuntimeError("poison record")
        fail_until_tier = payload.get("fail_until_tier")
        if isinstance(fail_until_tier, int) and retry_tier(record) < fail_until_tier:
            raise RuntimeError(f"failing until tier {fail_until_tier}")
        fail_times = payload.get("fail_times")
        if isinstance(fail_times, int) and fail_times > 0:
            failed = self.failures.get(event_key, 0)
            if failed < fail_times:
                self.failures[event_key] = failed + 1
                raise RuntimeError(f"transient failure {failed + 1} of {fail_times}")


class PlainProcessor:
    """Bench mode ``plain``: the same handler in autocommit, no inbox."""

    def __init__(self, connect) -> None:
        self._conn = connect(autocommit=True)

    def process(self, record: Message, handler) -> ProcessResult:
        handler(self._conn, record)
        return ProcessResult(Outcome.PROCESSED, _header_text(record, "event_key"), 1)

    def close(self) -> None:
        self._conn.close()


def _crash_hook(
    point: str, crash_point: str, crash_key: str, marker: str, outcome: Outcome = Outcome.PROCESSED
):
    """A hook that ends the process with status 137 at the crash point, once per marker file;
    called with a result, only for ``outcome``."""

    def crash(record: Message, result: ProcessResult | None = None) -> None:
        if crash_point != point or _header_text(record, "event_key") != crash_key:
            return
        if result is not None and result.outcome is not outcome:
            return
        if marker:
            if os.path.exists(marker):
                return
            with open(marker, "w") as f:
                f.write(f"{point} {crash_key}\n")
        print(f"crashing at {point} for {crash_key}", file=sys.stderr, flush=True)
        os._exit(137)

    return crash


def _retry_tiers(text: str) -> list[float]:
    """INBOX_RETRY_TIERS_MS: comma-separated delays in ms (absent or empty: no tiers)."""
    tiers = []
    for field in text.split(","):
        field = field.strip()
        if not field:
            continue
        if not field.isdigit():
            raise ValueError(f"INBOX_RETRY_TIERS_MS: {field!r} is not a delay in ms")
        tiers.append(int(field) / 1000.0)
    return tiers


def _percentile(sorted_ms: list[float], p: float) -> float:
    if not sorted_ms:
        return 0.0
    rank = max(1, -(-len(sorted_ms) * p // 100))  # nearest rank
    return sorted_ms[int(rank) - 1]


def main() -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(message)s")
    bootstrap = _env("INBOX_BOOTSTRAP", "127.0.0.1:9092")
    consumer_name = _required("INBOX_CONSUMER")
    topic = _required("INBOX_TOPIC")
    mode = _env("INBOX_MODE", "inbox")
    exit_after = int(_env("INBOX_EXIT_AFTER", "0"))
    connect = functools.partial(
        pymysql.connect,
        host=_env("INBOX_DB_HOST", "127.0.0.1"),
        port=int(_env("INBOX_DB_PORT", "3306")),
        user=_env("INBOX_DB_USER", "root"),
        password=os.environ.get("INBOX_DB_PASSWORD", ""),
        database=_required("INBOX_DB_NAME"),
        charset="utf8mb4",
        # A database on loopback, as the other helpers' scenario consumers reach it: their
        # drivers connect without TLS unless asked, PyMySQL uses TLS whenever the server offers
        # it (MySQL 8 does), which made every round trip dearer here than there. Connect to a
        # remote database with TLS (ssl=..., ssl_verify_identity=True).
        ssl_disabled=True,
    )
    handler = BusinessHandler(consumer_name)
    consumer_config = {
        "bootstrap.servers": bootstrap,
        "group.id": _env("INBOX_GROUP", consumer_name),
        "auto.offset.reset": "earliest",
        # A crashed consumer's partitions move to its restarted successor after this long.
        "session.timeout.ms": 10000,
    }

    latencies: list[float] = []
    span: list[float] = []  # [first poll that returned a record, last settle]
    runner: InboxRunner

    def on_settled(record: Message, result: ProcessResult, polled_at: float) -> None:
        now = time.monotonic()
        span[:] = [span[0] if span else polled_at, now]
        latencies.append((now - polled_at) * 1000.0)
        if mode == "plain":
            _say(
                f"OUTCOME {result.outcome.value} {result.event_key or '-'} "
                f"{record.partition()} {record.offset()} {result.attempts}"
            )
        if exit_after and len(latencies) >= exit_after:
            runner.stop()

    if mode == "plain":
        processor = PlainProcessor(connect)
    elif mode == "inbox":
        crash = (
            _env("INBOX_CRASH_POINT"),
            _env("INBOX_CRASH_EVENT_KEY"),
            _env("INBOX_CRASH_MARKER"),
        )
        settings = InboxSettings(
            consumer=consumer_name,
            dead_letter_topic=_required("INBOX_DLQ_TOPIC"),
            version_header=_env("INBOX_VERSION_HEADER") or None,
            gap_policy=_env("INBOX_GAP_POLICY", "park"),
            max_attempts=int(_env("INBOX_MAX_ATTEMPTS", "3")),
            backoff_initial=int(_env("INBOX_BACKOFF_MS", "50")) / 1000.0,
            backoff_max=1.0,
            outage_budget=int(_env("INBOX_OUTAGE_BUDGET_MS", "300000")) / 1000.0,
            gap_deadline=int(_env("INBOX_GAP_DEADLINE_MS", "3600000")) / 1000.0,
            park_sweep_interval=int(_env("INBOX_PARK_SWEEP_MS", "10000")) / 1000.0,
            retry_tiers=_retry_tiers(_env("INBOX_RETRY_TIERS_MS")),
            # Batch mode (1: off); the BENCH latency then runs until the record's batch settled.
            batch_max_records=int(_env("INBOX_BATCH", "1")),
            batch_max_wait=int(_env("INBOX_BATCH_WAIT_MS", "20")) / 1000.0,
        )
        crash_after_commit = _crash_hook("after_db_commit", *crash)
        # The copy is on its tier, the record's offset not committed.
        crash_after_retry_copy = _crash_hook("after_retry_copy", *crash, Outcome.RETRIED)

        def after_commit(record: Message, result: ProcessResult) -> None:
            # Every settled record passes here once: those the runner polled, and those
            # settled later by themselves (resumed parked versions, a sweep's dead letters).
            # A retry copy is reported at the original record's partition and offset.
            _, partition, offset = origin(record)
            _say(
                f"OUTCOME {result.outcome.value} {result.event_key or '-'} "
                f"{partition} {offset} {result.attempts}"
            )
            crash_after_commit(record, result)
            crash_after_retry_copy(record, result)

        hooks = Hooks(
            before_commit=_crash_hook("after_handler", *crash),
            after_commit=after_commit,
        )
        producer = dead_letter_producer({"bootstrap.servers": bootstrap})
        processor = Inbox(settings, connect, producer, hooks)
    else:
        raise ValueError(f"INBOX_MODE must be inbox or plain, not {mode!r}")

    runner = InboxRunner(processor, handler, consumer_config, [topic], on_settled=on_settled)
    runner.install_signal_handlers()
    runner.subscribe()
    _say("READY")
    try:
        runner.run()
    finally:
        processor.close()
    if exit_after:
        ordered = sorted(latencies)
        seconds = span[1] - span[0] if span else 0.0
        _say(
            f"BENCH records={len(ordered)} seconds={seconds:.3f} "
            f"p50_ms={_percentile(ordered, 50):.3f} p99_ms={_percentile(ordered, 99):.3f}"
        )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as error:
        print(f"scenario_consumer: error: {error}", file=sys.stderr, flush=True)
        sys.exit(1)
