"""Inbox.process against the real database and Kafka."""

from __future__ import annotations

import pytest
from support import BOOTSTRAP, Database, Topics, headers_of, record

from outbox_inbox import (
    DeadLetterError,
    GapPolicy,
    Hooks,
    Inbox,
    InboxSettings,
    Outcome,
    backoff_delay,
    dead_letter_producer,
)


class CouponHandler:
    """Inserts a coupon row in the inbox's transaction; fails the first ``fail`` calls (or all)."""

    def __init__(self, fail: int = 0) -> None:
        self.calls = 0
        self.fail = fail

    def __call__(self, tx, rec) -> None:
        self.calls += 1
        headers = headers_of(rec)
        with tx.cursor() as cur:
            cur.execute(
                "INSERT INTO coupons (consumer, order_id, event_key) VALUES (%s, %s, %s)",
                ("c1", rec.key().decode(), headers.get("event_key")),
            )
        if self.calls <= self.fail:
            raise RuntimeError(f"boom {self.calls}")


def make_inbox(db: Database, topics: Topics, hooks: Hooks | None = None, **overrides) -> Inbox:
    settings = InboxSettings(
        consumer="c1",
        dead_letter_topic=topics.dlq,
        backoff_initial=0.01,
        backoff_max=0.05,
        **overrides,
    )
    producer = dead_letter_producer({"bootstrap.servers": BOOTSTRAP})
    return Inbox(settings, db.connect, producer, hooks)


def coupons(db: Database) -> list[str]:
    return [row[0] for row in db.query("SELECT event_key FROM coupons ORDER BY id")]


def test_backoff_is_exponential_and_capped() -> None:
    assert [backoff_delay(n, 0.1, 1.0) for n in range(1, 6)] == [0.1, 0.2, 0.4, 0.8, 1.0]
    assert backoff_delay(1000, 0.1, 10.0) == 10.0


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError):
        InboxSettings(consumer="c", dead_letter_topic="")
    with pytest.raises(ValueError):
        InboxSettings(consumer="", dead_letter_topic="d")
    with pytest.raises(ValueError):
        InboxSettings(consumer="c", dead_letter_topic="d", max_attempts=0)
    assert InboxSettings("c", "d", gap_policy="retry").gap_policy is GapPolicy.RETRY


def test_duplicate_is_acknowledged_without_running_the_handler(db, topics) -> None:
    topics.produce([record("e-1"), record("e-1"), record("e-2")])
    first, again, other = topics.read(3)
    seen = []
    inbox = make_inbox(db, topics, Hooks(after_commit=lambda r, res: seen.append(res.outcome)))
    handler = CouponHandler()

    assert inbox.process(first, handler).outcome is Outcome.PROCESSED
    result = inbox.process(again, handler)
    assert (result.outcome, result.event_key, result.attempts) == (Outcome.DUPLICATE, "e-1", 1)
    assert inbox.process(other, handler).outcome is Outcome.PROCESSED

    assert handler.calls == 2
    assert coupons(db) == ["e-1", "e-2"]
    assert seen == [Outcome.PROCESSED, Outcome.DUPLICATE, Outcome.PROCESSED]
    rows = db.query(
        "SELECT CONVERT(consumer USING utf8mb4), CONVERT(event_key USING utf8mb4), topic,"
        " kafka_partition, kafka_offset FROM outbox_inbox"
    )
    assert sorted(rows) == [("c1", "e-1", topics.topic, 0, 0), ("c1", "e-2", topics.topic, 0, 2)]
    inbox.close()


# Event keys (and aggregate ids) that differ only in case, accent or trailing spaces: distinct
# events, which the inbox must never merge.
KEY_TWINS = ["evt-a1B", "evt-A1b", "café", "cafe", "k", "k "]


def test_keys_differing_in_case_accent_or_trailing_spaces_are_distinct(db, topics) -> None:
    topics.produce([record(k, key=k, version=1) for k in KEY_TWINS])
    topics.produce([record(k, key=k, version=2) for k in KEY_TWINS])
    first, again = (records := topics.read(2 * len(KEY_TWINS)))[:6], records[6:]
    inbox = make_inbox(db, topics, version_header="version")
    handler = CouponHandler()

    outcomes = [(r.event_key, r.outcome.value) for r in (inbox.process(m, handler) for m in first)]
    assert outcomes == [(k, "processed") for k in KEY_TWINS]
    outcomes = [(r.event_key, r.outcome.value) for r in (inbox.process(m, handler) for m in again)]
    assert outcomes == [(k, "duplicate") for k in KEY_TWINS]

    assert handler.calls == len(KEY_TWINS)
    assert coupons(db) == KEY_TWINS
    inbox_keys = db.query("SELECT event_key FROM outbox_inbox ORDER BY kafka_offset")
    assert [row[0] for row in inbox_keys] == [k.encode() for k in KEY_TWINS]
    versions = db.query("SELECT aggregate_id, version FROM outbox_inbox_version")
    assert sorted(versions) == sorted((k.encode(), 1) for k in KEY_TWINS)
    inbox.close()


def test_handler_error_rolls_back_and_retries(db, topics) -> None:
    topics.produce([record("e-1")])
    (rec,) = topics.read(1)
    calls = []
    hooks = Hooks(before_commit=lambda r: calls.append(("before", len(coupons(db)))))
    inbox = make_inbox(db, topics, hooks, max_attempts=3)
    handler = CouponHandler(fail=2)

    result = inbox.process(rec, handler)

    assert (result.outcome, result.attempts) == (Outcome.PROCESSED, 3)
    assert handler.calls == 3
    assert coupons(db) == ["e-1"]  # the two failed attempts left nothing
    assert calls == [("before", 0)]  # before_commit once, before the commit
    inbox.close()


def test_handler_error_dead_letters_after_max_attempts(db, topics) -> None:
    headers_in = record("e-poison", key="order-9")["headers"]
    topics.produce([record("e-ok"), record("e-poison", key="order-9")])
    ok, poison = topics.read(2)
    inbox = make_inbox(db, topics, max_attempts=3)
    handler = CouponHandler(fail=10**6)

    result = inbox.process(poison, handler)

    assert (result.outcome, result.attempts) == (Outcome.DEAD_LETTERED, 3)
    assert result.reason == "boom 3"
    assert handler.calls == 3
    assert coupons(db) == []
    assert db.query("SELECT COUNT(*) FROM outbox_inbox") == [(0,)]
    (dead,) = topics.read(1, topic=topics.dlq)
    assert dead.key() == b"order-9"
    assert dead.value() == poison.value()
    assert dead.headers()[: len(headers_in)] == headers_in  # original headers, unchanged
    h = headers_of(dead)
    assert h["dlq_reason"] == "boom 3"
    assert h["dlq_topic"] == topics.topic
    assert h["dlq_partition"] == "0"
    assert h["dlq_offset"] == str(poison.offset()) == "1"
    assert h["dlq_consumer"] == "c1"
    assert h["dlq_attempts"] == "3"
    # The partition moves on.
    assert inbox.process(ok, CouponHandler()).outcome is Outcome.PROCESSED
    inbox.close()


@pytest.mark.parametrize("event_key", [None, ""])
def test_missing_event_key_is_dead_lettered_at_once(db, topics, event_key) -> None:
    topics.produce([record(event_key)])
    (rec,) = topics.read(1)
    inbox = make_inbox(db, topics)
    handler = CouponHandler()

    result = inbox.process(rec, handler)

    assert (result.outcome, result.attempts) == (Outcome.DEAD_LETTERED, 0)
    assert handler.calls == 0
    (dead,) = topics.read(1, topic=topics.dlq)
    h = headers_of(dead)
    assert (h["dlq_reason"], h["dlq_attempts"]) == ("missing event_key header", "0")
    assert db.query("SELECT COUNT(*) FROM outbox_inbox") == [(0,)]
    inbox.close()


VERSION_EVENTS = [
    ("A", "A-v1", 1),
    ("A", "A-v2", 2),
    ("A", "A-v2-again", 2),
    ("A", "A-v1-late", 1),
    ("A", "A-v4-early", 4),
    ("A", "A-v3", 3),
    ("A", "A-v4", 4),
    ("B", "B-v1", 1),
]


def test_versions_stale_and_gap_park(db, topics) -> None:
    """Under the default policy (park) the early version 4 waits in the parked table and is
    applied by itself right after version 3: the later copy of version 4 is then stale."""
    topics.produce([record(k, key=agg, version=v) for agg, k, v in VERSION_EVENTS])
    records = topics.read(len(VERSION_EVENTS))
    seen = []
    hooks = Hooks(after_commit=lambda r, res: seen.append((res.event_key, res.outcome.value)))
    inbox = make_inbox(db, topics, hooks, version_header="version")
    handler = CouponHandler()

    outcomes = {r.event_key: r.outcome.value for r in (inbox.process(m, handler) for m in records)}

    assert outcomes == {
        "A-v1": "processed",
        "A-v2": "processed",
        "A-v2-again": "stale",
        "A-v1-late": "stale",
        "A-v4-early": "parked",
        "A-v3": "processed",
        "A-v4": "stale",
        "B-v1": "processed",
    }
    assert ("A-v4-early", "resumed") in seen
    assert seen.index(("A-v4-early", "resumed")) == seen.index(("A-v3", "processed")) + 1
    assert coupons(db) == ["A-v1", "A-v2", "A-v3", "A-v4-early", "B-v1"]
    stored = db.query(
        "SELECT CONVERT(aggregate_type USING utf8mb4), CONVERT(aggregate_id USING utf8mb4),"
        " version FROM outbox_inbox_version"
    )
    assert sorted(stored) == [("order", "A", 4), ("order", "B", 1)]
    assert db.query("SELECT COUNT(*) FROM outbox_inbox_parked") == [(0,)]
    # A stale record keeps its inbox row (a redelivery is a duplicate); the resumed one has its
    # own, at the offset it was read from.
    rows = dict(db.query("SELECT event_key, kafka_offset FROM outbox_inbox"))
    assert rows[b"A-v2-again"] == 2 and rows[b"A-v4-early"] == 4
    assert inbox.process(records[2], handler).outcome is Outcome.DUPLICATE
    assert inbox.process(records[4], handler).outcome is Outcome.DUPLICATE
    inbox.close()


def test_versions_stale_and_gap_dead_letter_policy(db, topics) -> None:
    """gap_policy="dead_letter": the old behaviour, a gap is dead-lettered at once."""
    topics.produce([record(k, key=agg, version=v) for agg, k, v in VERSION_EVENTS])
    records = topics.read(len(VERSION_EVENTS))
    inbox = make_inbox(db, topics, version_header="version", gap_policy="dead_letter")
    handler = CouponHandler()

    outcomes = {r.event_key: r.outcome.value for r in (inbox.process(m, handler) for m in records)}

    assert outcomes == {
        "A-v1": "processed",
        "A-v2": "processed",
        "A-v2-again": "stale",
        "A-v1-late": "stale",
        "A-v4-early": "dead_lettered",
        "A-v3": "processed",
        "A-v4": "processed",
        "B-v1": "processed",
    }
    assert coupons(db) == ["A-v1", "A-v2", "A-v3", "A-v4", "B-v1"]
    # A stale record keeps its inbox row (a redelivery is a duplicate); a dead-lettered one none.
    keys = {row[0].decode() for row in db.query("SELECT event_key FROM outbox_inbox")}
    assert "A-v2-again" in keys and "A-v4-early" not in keys
    assert db.query("SELECT COUNT(*) FROM outbox_inbox_parked") == [(0,)]
    assert inbox.process(records[2], handler).outcome is Outcome.DUPLICATE
    (dead,) = topics.read(1, topic=topics.dlq)
    h = headers_of(dead)
    assert h["event_key"] == "A-v4-early"
    assert h["dlq_reason"] == "version gap: expected 3, got 4"
    inbox.close()


def test_version_gap_retry_policy_dead_letters_after_max_attempts(db, topics) -> None:
    topics.produce([record("A-v1", key="A", version=1), record("A-v3", key="A", version=3)])
    v1, v3 = topics.read(2)
    inbox = make_inbox(db, topics, version_header="version", gap_policy="retry", max_attempts=3)
    handler = CouponHandler()

    assert inbox.process(v1, handler).outcome is Outcome.PROCESSED
    result = inbox.process(v3, handler)

    assert (result.outcome, result.attempts) == (Outcome.DEAD_LETTERED, 3)
    assert result.reason == "version gap: expected 2, got 3"
    assert handler.calls == 1
    (dead,) = topics.read(1, topic=topics.dlq)
    h = headers_of(dead)
    assert (h["dlq_reason"], h["dlq_attempts"]) == ("version gap: expected 2, got 3", "3")
    inbox.close()


def test_invalid_version_header_is_a_poison_record(db, topics) -> None:
    topics.produce([record("A-x", key="A", version="seven")])
    (rec,) = topics.read(1)
    inbox = make_inbox(db, topics, version_header="version")
    handler = CouponHandler()

    result = inbox.process(rec, handler)

    assert (result.outcome, result.attempts) == (Outcome.DEAD_LETTERED, 0)
    assert result.reason == "invalid version header: seven"
    assert handler.calls == 0
    (dead,) = topics.read(1, topic=topics.dlq)
    assert headers_of(dead)["dlq_reason"] == "invalid version header: seven"
    inbox.close()


def test_custom_table_names(db, topics) -> None:
    db.query("CREATE TABLE my_inbox LIKE outbox_inbox")
    topics.produce([record("e-1"), record("e-1")])
    first, again = topics.read(2)
    inbox = make_inbox(db, topics, inbox_table="my_inbox")
    assert inbox.process(first, CouponHandler()).outcome is Outcome.PROCESSED
    assert inbox.process(again, CouponHandler()).outcome is Outcome.DUPLICATE
    assert db.query("SELECT COUNT(*) FROM my_inbox") == [(1,)]
    assert db.query("SELECT COUNT(*) FROM outbox_inbox") == [(0,)]
    inbox.close()


def test_dead_letter_that_cannot_be_produced_raises(db, topics) -> None:
    topics.produce([record(None)])
    (rec,) = topics.read(1)
    settings = InboxSettings(consumer="c1", dead_letter_topic="inbox-python-invalid/topic")
    producer = dead_letter_producer({"bootstrap.servers": BOOTSTRAP, "message.timeout.ms": 5000})
    inbox = Inbox(settings, db.connect, producer)
    with pytest.raises(DeadLetterError, match="Invalid topic"):
        inbox.process(rec, CouponHandler())
    inbox.close()


def test_lost_connection_is_not_an_attempt_then_reconnects(db, topics) -> None:
    """A connection killed under the handler (2013) is an infrastructure error: redone on a new
    connection without counting as an attempt."""
    topics.produce([record("e-1")])
    (rec,) = topics.read(1)
    inbox = make_inbox(db, topics, max_attempts=3)
    handler = CouponHandler()
    killed = []

    def kill_my_connection_once(tx, r) -> None:
        if not killed:
            killed.append(tx.thread_id())
            db.query(f"KILL {tx.thread_id()}")
        handler(tx, r)

    result = inbox.process(rec, kill_my_connection_once)

    assert (result.outcome, result.attempts) == (Outcome.PROCESSED, 1)
    assert len(killed) == 1
    assert coupons(db) == ["e-1"]
    inbox.close()
