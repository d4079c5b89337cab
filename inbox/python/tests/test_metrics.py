"""Metrics (inbox/CONTRACT.md, "Metrics") read back from a prometheus_client registry, against
the real database and Kafka."""

from __future__ import annotations

import threading
import time
import uuid

from prometheus_client import CollectorRegistry
from support import BOOTSTRAP, TIMEOUT, Topics, headers_of, record, wait_until
from test_inbox import CouponHandler

from outbox_inbox import (
    Hooks,
    Inbox,
    InboxRunner,
    InboxSettings,
    TopicSettings,
    dead_letter_producer,
)
from outbox_inbox.inbox import ParkedRecord


def make_inbox(db, t: Topics, registry, hooks=None, **settings) -> Inbox:
    s = InboxSettings(
        **{
            "consumer": "c1",
            "dead_letter_topic": t.dlq,
            "backoff_initial": 0.01,
            "backoff_max": 0.02,
            "metrics_registry": registry,
            **settings,
        }
    )
    return Inbox(s, db.connect, dead_letter_producer({"bootstrap.servers": BOOTSTRAP}), hooks)


def records_total(registry, topic: str, outcome: str, consumer: str = "c1") -> float | None:
    return registry.get_sample_value(
        "outbox_inbox_records_total", {"consumer": consumer, "topic": topic, "outcome": outcome}
    )


class FailOn(CouponHandler):
    """Inserts a coupon; fails every time for the event keys in ``bad``."""

    def __init__(self, *bad: str) -> None:
        super().__init__()
        self.bad = set(bad)

    def __call__(self, tx, rec) -> None:
        super().__call__(tx, rec)
        if headers_of(rec)["event_key"] in self.bad:
            raise RuntimeError("bad record")


def test_records_are_counted_by_original_topic_and_outcome(db, topics) -> None:
    """A small run: processed, a duplicate, a stale version, a dead letter, a parked version
    that resumes; a retry copy is counted under its original topic."""
    topics.produce(
        [
            record("e-1", "A", version=1),
            record("e-1", "A", version=1),  # the same event again: duplicate
            record("e-old", "A", version=1),  # another event with an applied version: stale
            record("e-bad", "B"),  # fails every attempt: dead-lettered
            record("e-3", "A", version=3),  # parked
            record("e-2", "A", version=2),  # processed, then e-3 resumed
        ]
    )
    registry = CollectorRegistry()
    inbox = make_inbox(db, topics, registry, version_header="version", max_attempts=2)
    other = make_inbox(db, topics, CollectorRegistry(), consumer="c2")  # its own registry
    same = make_inbox(db, topics, registry, consumer="c3")  # shares the registry: no collision
    handler = FailOn("e-bad")
    for rec in topics.read(6):
        inbox.process(rec, handler)
    copy = record("e-copy")
    copy["headers"] += [
        ("retry_count", b"1"),
        ("retry_at", b"0"),
        ("original_topic", b"orders"),
        ("original_partition", b"0"),
        ("original_offset", b"9"),
    ]
    inbox.process(ParkedRecord("orders.retry.1", 0, 0, b"A", b"{}", copy["headers"]), handler)
    for i in (inbox, other, same):
        i.close()

    counts = {
        outcome: records_total(registry, topics.topic, outcome)
        for outcome in ("processed", "duplicate", "stale", "dead_lettered", "parked", "resumed")
    }
    assert counts == {
        "processed": 2.0,
        "duplicate": 1.0,
        "stale": 1.0,
        "dead_lettered": 1.0,
        "parked": 1.0,
        "resumed": 1.0,
    }
    assert records_total(registry, topics.topic, "retried") is None
    assert records_total(registry, "orders", "processed") == 1.0
    assert records_total(registry, "orders.retry.1", "processed") is None
    assert records_total(registry, topics.topic, "processed", consumer="c3") is None


def test_parked_gauges_after_a_sweep_and_swept_outcomes_are_counted(db, topics) -> None:
    """After a sweep: the parked rows and the age of the oldest; a row of a topic whose
    gap_deadline is 0 is compensated by the sweep (counted); once the gaps close, 0 and 0."""
    registry = CollectorRegistry()
    compensated: list[str] = []
    hooks = Hooks(on_gap_expired=lambda rec, _at: compensated.append(headers_of(rec)["event_key"]))
    inbox = make_inbox(
        db,
        topics,
        registry,
        hooks,
        version_header="version",
        topics={"fast": TopicSettings(gap_deadline=0.0)},
    )
    handler = CouponHandler()

    def at(topic: str, offset: int, r: dict) -> ParkedRecord:
        return ParkedRecord(topic, 0, offset, r["key"], r["value"], r["headers"])

    parked = lambda name: registry.get_sample_value(name, {"consumer": "c1"})  # noqa: E731
    assert parked("outbox_inbox_parked_records") is None  # no sweep yet
    inbox.process(at(topics.topic, 0, record("a-1", "A", version=1)), handler)
    inbox.process(at(topics.topic, 1, record("a-3", "A", version=3)), handler)
    inbox.process(at(topics.topic, 2, record("a-4", "A", version=4)), handler)
    inbox.process(at("fast", 0, record("f-1", "F", version=1)), handler)
    inbox.process(at("fast", 1, record("f-3", "F", version=3)), handler)
    time.sleep(0.3)
    sweep = inbox.sweep_parked(handler)
    assert (sweep.compensated, sweep.parked, compensated) == (1, 2, ["f-3"])
    assert parked("outbox_inbox_parked_records") == 2.0
    assert 0.3 <= parked("outbox_inbox_parked_oldest_seconds") < 30.0
    assert records_total(registry, "fast", "compensated") == 1.0
    assert records_total(registry, topics.topic, "parked") == 2.0

    inbox.process(at(topics.topic, 3, record("a-2", "A", version=2)), handler)
    inbox.sweep_parked(handler)
    inbox.close()
    assert parked("outbox_inbox_parked_records") == 0.0
    assert parked("outbox_inbox_parked_oldest_seconds") == 0.0
    assert records_total(registry, topics.topic, "resumed") == 2.0


def test_the_runner_sets_the_consumer_lag_after_each_poll(db, topics) -> None:
    """Five records in partition 0 produced before the runner starts: after each poll the lag
    is the high watermark (5) minus the position (the next offset); partition 1 (no records
    polled) has no series."""
    topics.produce([record(f"e-{i}", partition=0) for i in range(5)])
    registry = CollectorRegistry()
    inbox = make_inbox(db, topics, registry)
    lags: list[float | None] = []
    labels = {"consumer": "c1", "topic": topics.topic, "partition": "0"}
    runner = InboxRunner(
        inbox,
        CouponHandler(),
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": f"inbox-python-g-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
        },
        [topics.topic],
        poll_timeout=0.1,
        on_settled=lambda *_: lags.append(
            registry.get_sample_value("outbox_inbox_consumer_lag", labels)
        ),
    )
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: len(lags) >= 5, "five records settled")
    finally:
        runner.stop()
        thread.join(TIMEOUT)
        inbox.close()
    assert lags == [4.0, 3.0, 2.0, 1.0, 0.0]
    assert (
        registry.get_sample_value("outbox_inbox_consumer_lag", {**labels, "partition": "1"}) is None
    )
