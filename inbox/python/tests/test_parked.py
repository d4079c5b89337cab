"""Parked versions (inbox/CONTRACT.md, "Parked versions") against the real database and Kafka."""

from __future__ import annotations

import re
import uuid

from confluent_kafka import Consumer, TopicPartition
from support import BOOTSTRAP, Database, Topics, headers_of, record
from test_inbox import CouponHandler, coupons, make_inbox

from outbox_inbox import Hooks, Outcome
from outbox_inbox.inbox import decode_headers, encode_headers

PARKED_SINCE = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z"


class Seen:
    """Records every (event_key, outcome) that ``after_commit`` reports, in order."""

    def __init__(self) -> None:
        self.outcomes: list[tuple[str | None, str]] = []

    def __call__(self, rec, result) -> None:
        self.outcomes.append((result.event_key, result.outcome.value))


def parked_rows(db: Database) -> list[tuple]:
    return db.query(
        "SELECT CONVERT(aggregate_id USING utf8mb4), version, CONVERT(event_key USING utf8mb4),"
        " kafka_offset, reason FROM outbox_inbox_parked ORDER BY aggregate_id, version"
    )


def dlq_size(topics: Topics) -> int:
    consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": f"wm-{uuid.uuid4().hex}"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topics.dlq, 0), timeout=10)
        return high - low
    finally:
        consumer.close()


def test_headers_encoding_round_trips() -> None:
    headers = [("a", b"1"), ("empty", b""), ("none", None), ("bin", b"\xff\x00\xfe"), ("a", b"2")]
    text = encode_headers(headers)
    assert text == '[["a", "MQ=="], ["empty", ""], ["none", null], ["bin", "/wD+"], ["a", "Mg=="]]'
    assert decode_headers(text) == headers
    assert encode_headers(None) == "[]"


def test_park_then_resume_in_version_order(db, topics) -> None:
    topics.produce(
        [
            record("A-v1", key="A", version=1),
            record("A-v4", key="A", version=4),
            record("A-v3", key="A", version=3),
            record("A-v2", key="A", version=2),
        ]
    )
    v1, v4, v3, v2 = topics.read(4)
    seen = Seen()
    inbox = make_inbox(db, topics, Hooks(after_commit=seen), version_header="version")
    handler = CouponHandler()

    assert inbox.process(v1, handler).outcome is Outcome.PROCESSED
    parked = inbox.process(v4, handler)
    assert (parked.outcome, parked.reason) == (Outcome.PARKED, "version gap: expected 2, got 4")
    assert inbox.process(v3, handler).outcome is Outcome.PARKED
    assert handler.calls == 1
    assert parked_rows(db) == [
        ("A", 3, "A-v3", 2, "version gap: expected 2, got 3"),
        ("A", 4, "A-v4", 1, "version gap: expected 2, got 4"),
    ]
    # The parked row keeps the record as received: key, value and headers.
    (key, value, headers, topic, partition) = db.query(
        "SELECT record_key, record_value, record_headers, topic, kafka_partition"
        " FROM outbox_inbox_parked WHERE version = 4"
    )[0]
    assert (key, value, topic, partition) == (v4.key(), v4.value(), topics.topic, 0)
    assert decode_headers(headers) == v4.headers()

    assert inbox.process(v2, handler).outcome is Outcome.PROCESSED

    assert seen.outcomes == [
        ("A-v1", "processed"),
        ("A-v4", "parked"),
        ("A-v3", "parked"),
        ("A-v2", "processed"),
        ("A-v3", "resumed"),
        ("A-v4", "resumed"),
    ]
    assert coupons(db) == ["A-v1", "A-v2", "A-v3", "A-v4"]
    assert parked_rows(db) == []
    assert db.query("SELECT version FROM outbox_inbox_version") == [(4,)]
    # Each resumed record's inbox row is where it was read: a redelivery is a duplicate.
    rows = dict(db.query("SELECT CONVERT(event_key USING utf8mb4), kafka_offset FROM outbox_inbox"))
    assert rows == {"A-v1": 0, "A-v4": 1, "A-v3": 2, "A-v2": 3}
    assert inbox.process(v4, handler).outcome is Outcome.DUPLICATE
    assert handler.calls == 4
    inbox.close()


def test_redelivered_parked_record_is_ignored(db, topics) -> None:
    topics.produce([record("A-v1", key="A", version=1), record("A-v3", key="A", version=3)])
    topics.produce([record("A-v3", key="A", version=3), record("A-v2", key="A", version=2)])
    v1, v3, v3_again, v2 = topics.read(4)
    seen = Seen()
    inbox = make_inbox(db, topics, Hooks(after_commit=seen), version_header="version")
    handler = CouponHandler()

    assert inbox.process(v1, handler).outcome is Outcome.PROCESSED
    assert inbox.process(v3, handler).outcome is Outcome.PARKED
    assert inbox.process(v3_again, handler).outcome is Outcome.PARKED
    # The primary key ignored the second copy: the row is the first one's.
    assert parked_rows(db) == [("A", 3, "A-v3", 1, "version gap: expected 2, got 3")]
    assert handler.calls == 1

    assert inbox.process(v2, handler).outcome is Outcome.PROCESSED
    assert seen.outcomes[-2:] == [("A-v2", "processed"), ("A-v3", "resumed")]
    assert coupons(db) == ["A-v1", "A-v2", "A-v3"]
    assert parked_rows(db) == []
    # After the resumption, another copy is a duplicate, not parked again.
    assert inbox.process(v3, handler).outcome is Outcome.DUPLICATE
    inbox.close()


def test_sweep_deletes_a_stale_row_and_resumes_a_due_one(db, topics) -> None:
    topics.produce(
        [
            record("A-v1", key="A", version=1),
            record("A-v3", key="A", version=3),
            record("B-v1", key="B", version=1),
            record("B-v3", key="B", version=3),
        ]
    )
    a1, a3, b1, b3 = topics.read(4)
    seen = Seen()
    inbox = make_inbox(db, topics, Hooks(after_commit=seen), version_header="version")
    handler = CouponHandler()
    for rec in (a1, a3, b1, b3):
        inbox.process(rec, handler)
    assert [row[2] for row in parked_rows(db)] == ["A-v3", "B-v3"]
    # Another process applied A's versions up to 5 (A-v3 is stale now) and B's version 2 (B-v3
    # is due now), without resuming them: a crash, or a peer.
    db.query("UPDATE outbox_inbox_version SET version = 5 WHERE aggregate_id = 'A'")
    db.query("UPDATE outbox_inbox_version SET version = 2 WHERE aggregate_id = 'B'")
    seen.outcomes.clear()

    sweep = inbox.sweep_parked(handler)

    assert (sweep.stale, sweep.resumed, sweep.dead_lettered, sweep.parked) == (1, 1, 0, 0)
    assert sweep.oldest is None
    assert sorted(seen.outcomes) == [("A-v3", "stale"), ("B-v3", "resumed")]
    assert coupons(db) == ["A-v1", "B-v1", "B-v3"]  # the stale one's handler never ran
    assert parked_rows(db) == []
    assert sorted(db.query("SELECT version FROM outbox_inbox_version")) == [(3,), (5,)]
    inbox.close()


def test_sweep_keeps_a_row_waiting_before_its_deadline(db, topics) -> None:
    topics.produce([record("A-v1", key="A", version=1), record("A-v3", key="A", version=3)])
    v1, v3 = topics.read(2)
    inbox = make_inbox(db, topics, version_header="version", gap_deadline=3600)
    handler = CouponHandler()
    inbox.process(v1, handler)
    inbox.process(v3, handler)

    sweep = inbox.sweep_parked(handler)

    assert (sweep.stale, sweep.resumed, sweep.dead_lettered, sweep.parked) == (0, 0, 0, 1)
    assert sweep.oldest is not None and 0 <= sweep.oldest < 60
    (expires,) = db.query(
        "SELECT TIMESTAMPDIFF(SECOND, parked_at, expires_at) FROM outbox_inbox_parked"
    )
    assert expires == (3600,)
    inbox.close()


def test_expired_parked_record_is_dead_lettered(db, topics) -> None:
    topics.produce([record("A-v1", key="A", version=1), record("A-v3", key="A-x", version=3)])
    topics.produce([record("A-v3", key="A", version=3)])
    v1, _, v3 = topics.read(3)
    seen = Seen()
    inbox = make_inbox(
        db, topics, Hooks(after_commit=seen), version_header="version", gap_deadline=0
    )
    handler = CouponHandler()
    inbox.process(v1, handler)
    assert inbox.process(v3, handler).outcome is Outcome.PARKED
    seen.outcomes.clear()

    sweep = inbox.sweep_parked(handler)

    assert (sweep.dead_lettered, sweep.parked, sweep.resumed) == (1, 0, 0)
    assert seen.outcomes == [("A-v3", "dead_lettered")]
    assert parked_rows(db) == []
    assert handler.calls == 1
    (dead,) = topics.read(1, topic=topics.dlq)
    assert (dead.key(), dead.value()) == (v3.key(), v3.value())
    assert dead.headers()[: len(v3.headers())] == v3.headers()
    h = headers_of(dead)
    assert re.fullmatch(
        f"version gap: expected 2, got 3; parked since {PARKED_SINCE}", h["dlq_reason"]
    )
    assert h["dlq_attempts"] == "0"
    assert (h["dlq_topic"], h["dlq_partition"], h["dlq_offset"]) == (topics.topic, "0", "2")
    assert h["dlq_consumer"] == "c1"
    # The version is not moved: version 2 is still awaited, and a later version 2 is applied.
    assert db.query("SELECT version FROM outbox_inbox_version") == [(1,)]
    inbox.close()


def test_on_gap_expired_compensates_instead_of_dead_lettering(db, topics) -> None:
    topics.produce([record("A-v1", key="A", version=1), record("A-v3", key="A", version=3)])
    v1, v3 = topics.read(2)
    calls: list[tuple[str, str, int]] = []
    fail = [True]

    def compensate(rec, parked_at: str) -> None:
        calls.append((headers_of(rec)["event_key"], parked_at, rec.offset()))
        if fail[0]:
            raise RuntimeError("compensation service down")

    seen = Seen()
    hooks = Hooks(after_commit=seen, on_gap_expired=compensate)
    inbox = make_inbox(db, topics, hooks, version_header="version", gap_deadline=0)
    handler = CouponHandler()
    inbox.process(v1, handler)
    inbox.process(v3, handler)
    seen.outcomes.clear()

    # The hook fails: the row stays, and the next sweep calls it again.
    sweep = inbox.sweep_parked(handler)
    assert (sweep.compensated, sweep.dead_lettered, sweep.parked) == (0, 0, 1)
    assert len(parked_rows(db)) == 1
    fail[0] = False
    sweep = inbox.sweep_parked(handler)
    assert (sweep.compensated, sweep.dead_lettered, sweep.parked) == (1, 0, 0)

    assert [(k, o) for k, _, o in calls] == [("A-v3", 1), ("A-v3", 1)]
    assert all(re.fullmatch(PARKED_SINCE, at) for _, at, _ in calls)
    assert calls[0][1] == calls[1][1]
    assert seen.outcomes == [("A-v3", "compensated")]
    assert parked_rows(db) == []
    assert dlq_size(topics) == 0
    assert handler.calls == 1
    inbox.close()
