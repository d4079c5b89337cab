"""Retry tiers (inbox/CONTRACT.md, "Retry tiers") against the real Kafka and database."""

from __future__ import annotations

import contextlib
import functools
import json
import threading
import time
import uuid

import pymysql
import pytest
from confluent_kafka.admin import AdminClient
from support import BOOTSTRAP, DB, TIMEOUT, Database, Topics, headers_of, record, wait_until

from outbox_inbox import (
    DeadLetterTopicError,
    Hooks,
    Inbox,
    InboxRunner,
    InboxSettings,
    Outcome,
    dead_letter_producer,
    ensure_topic,
    origin,
    retry_tier,
)
from outbox_inbox.inbox import ParkedRecord


@pytest.fixture
def tiers(topics: Topics):
    """The tier topics the runner creates, deleted afterwards."""
    names = [f"{topics.topic}.retry.{n}" for n in (1, 2)]
    yield names
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    for future in admin.delete_topics(names).values():
        with contextlib.suppress(Exception):
            future.result(TIMEOUT)


def partitions(topic: str) -> int:
    """How many partitions the broker gave a tier topic it created (its defaults)."""
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    return len(admin.list_topics(topic, timeout=TIMEOUT).topics[topic].partitions)


def fail_until_tier(tx, rec) -> None:
    """One coupon per record; fails while the record's tier is below its payload's
    ``fail_until_tier``."""
    with tx.cursor() as cur:
        cur.execute(
            "INSERT INTO coupons (consumer, order_id, event_key) VALUES (%s, %s, %s)",
            ("c1", rec.key().decode(), headers_of(rec)["event_key"]),
        )
    wanted = json.loads(rec.value()).get("fail_until_tier", 0)
    if retry_tier(rec) < wanted:
        raise RuntimeError(f"failing until tier {wanted}")


class Running:
    """An InboxRunner with retry tiers on its own thread; ``settled`` records
    ``(outcome, event_key, topic, partition, offset, retry_tier, time)``."""

    def __init__(self, db: Database, topics: Topics, tiers: list[float], **settings) -> None:
        s = InboxSettings(
            **{
                "consumer": "c1",
                "dead_letter_topic": topics.dlq,
                "max_attempts": 2,
                "backoff_initial": 0.01,
                "backoff_max": 0.02,
                "retry_tiers": tiers,
                **settings,
            }
        )
        connect = functools.partial(pymysql.connect, **DB, database=db.name)
        self.inbox = Inbox(s, connect, dead_letter_producer({"bootstrap.servers": BOOTSTRAP}))
        self.settled: list[tuple] = []
        self._lock = threading.Lock()
        config = {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": f"inbox-python-g-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "topic.metadata.refresh.interval.ms": 1000,
        }
        self.runner = InboxRunner(
            self.inbox,
            fail_until_tier,
            config,
            [topics.topic],
            poll_timeout=0.1,
            on_settled=self._on_settled,
        )
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _on_settled(self, rec, result, _polled_at) -> None:
        with self._lock:
            self.settled.append(
                (
                    result.outcome,
                    result.event_key,
                    rec.topic(),
                    rec.partition(),
                    rec.offset(),
                    retry_tier(rec),
                    time.time(),
                )
            )

    def outcomes(self, event_key: str) -> list[tuple]:
        with self._lock:
            return [s for s in self.settled if s[1] == event_key]

    def _run(self) -> None:
        try:
            self.runner.run()
        except BaseException as error:
            self.error = error
        finally:
            self.inbox.close()

    def stop(self) -> None:
        self.runner.stop()
        self.thread.join(TIMEOUT)
        assert not self.thread.is_alive(), "the runner did not stop"
        assert self.error is None, repr(self.error)


def failing(event_key: str, key: str, until: int, partition: int = 0) -> dict:
    value = json.dumps({"order_id": key, "fail_until_tier": until}).encode()
    return record(event_key, key, value=value, partition=partition)


def test_a_record_failing_in_its_topic_succeeds_in_tier_1(db, topics, tiers) -> None:
    """Attempts used up in the topic: a copy on tier 1 (every header kept, the retry headers
    added), the partition goes on, the copy succeeds once its delay has passed: one effect, the
    inbox row names the original record."""
    topics.produce([failing("e-1", "order-1", 1), record("e-2", "order-2")])
    running = Running(db, topics, [0.5])
    wait_until(
        lambda: (
            running.outcomes("e-1")[-1:] and running.outcomes("e-1")[-1][0] is Outcome.PROCESSED
        ),
        "e-1 processed in tier 1",
    )
    wait_until(lambda: running.outcomes("e-2"), "e-2 processed")
    running.stop()

    first, second = running.outcomes("e-1")
    assert (first[0], first[2], first[5]) == (Outcome.RETRIED, topics.topic, 0)
    assert (second[0], second[2], second[5]) == (Outcome.PROCESSED, tiers[0], 1)
    assert second[6] - first[6] >= 0.45, "the copy was processed before its delay"
    coupons = db.query("SELECT event_key, COUNT(*) FROM coupons GROUP BY event_key")
    assert sorted(coupons) == [("e-1", 1), ("e-2", 1)]
    rows = db.query(
        "SELECT topic, kafka_partition, kafka_offset FROM outbox_inbox WHERE event_key = 'e-1'"
    )
    assert rows == [(topics.topic, 0, first[4])]

    (copy,) = topics.read(1, tiers[0], partitions(tiers[0]))
    h = headers_of(copy)
    assert (copy.key(), json.loads(copy.value())["fail_until_tier"]) == (b"order-1", 1)
    for name in ("id", "event_type", "aggregate_type", "event_key"):
        assert name in h, name
    assert h["retry_count"] == "1"
    assert (h["original_topic"], h["original_partition"], h["original_offset"]) == (
        topics.topic,
        "0",
        str(first[4]),
    )
    assert h["retry_error"] == "failing until tier 1"
    (entry,) = json.loads(h["retry_history"])
    assert {k: entry[k] for k in ("topic", "partition", "offset", "attempts", "error")} == {
        "topic": topics.topic,
        "partition": 0,
        "offset": first[4],
        "attempts": 2,
        "error": "failing until tier 1",
    }
    assert int(h["retry_at"]) - entry["failed_at"] == 500
    assert origin(copy) == (topics.topic, 0, first[4])


def test_two_tiers_exhausted_go_to_the_dead_letter_with_their_history(db, topics, tiers) -> None:
    """A record failing in its topic and both tiers is dead-lettered after tier 2: the letter
    keeps the copy's headers, names the original record, counts tier 2's attempts."""
    topics.produce([failing("e-1", "order-1", 99)])
    running = Running(db, topics, [0.1, 0.2])
    wait_until(
        lambda: (
            [o[0] for o in running.outcomes("e-1")]
            == [Outcome.RETRIED, Outcome.RETRIED, Outcome.DEAD_LETTERED]
        ),
        "e-1 retried twice, then dead-lettered",
    )
    running.stop()
    (letter,) = topics.read(1, topics.dlq)
    h = headers_of(letter)
    assert (h["dlq_topic"], h["dlq_partition"], h["dlq_offset"]) == (topics.topic, "0", "0")
    assert h["dlq_attempts"] == "2"
    assert h["retry_count"] == "2"
    assert h["dlq_reason"] == "failing until tier 99"
    history = json.loads(h["retry_history"])
    assert [(e["topic"], e["attempts"]) for e in history] == [
        (topics.topic, 2),
        (tiers[0], 2),
    ]
    assert db.query("SELECT COUNT(*) FROM coupons") == [(0,)]
    assert db.query("SELECT COUNT(*) FROM outbox_inbox") == [(0,)]


def test_a_copy_waits_for_its_retry_at_while_another_partition_goes_on(db, topics, tiers) -> None:
    """A copy whose retry_at has not come is not processed (its partition paused) while a record
    of another partition produced later is; then the copy is."""
    topics.produce([failing("e-1", "order-1", 1, partition=0)])
    running = Running(db, topics, [3.0])
    wait_until(lambda: running.outcomes("e-1"), "e-1 retried")
    retried_at = running.outcomes("e-1")[0][6]
    topics.produce([record("e-2", "order-2", partition=1)])
    wait_until(lambda: running.outcomes("e-2"), "e-2 processed")
    e2_at = running.outcomes("e-2")[0][6]
    assert len(running.outcomes("e-1")) == 1, "the copy was processed before its retry_at"
    assert e2_at - retried_at < 3.0
    wait_until(lambda: len(running.outcomes("e-1")) == 2, "the copy processed")
    running.stop()
    done = running.outcomes("e-1")[1]
    assert done[0] is Outcome.PROCESSED and done[2] == tiers[0]
    assert done[6] - retried_at >= 2.9, "the copy was processed before its retry_at"


def test_settings_refuse_negative_delays_and_a_format_without_n() -> None:
    with pytest.raises(ValueError):
        InboxSettings(consumer="c", dead_letter_topic="d", retry_tiers=[-1.0])
    with pytest.raises(ValueError):
        InboxSettings(
            consumer="c", dead_letter_topic="d", retry_tiers=[1.0], retry_topic_format="x"
        )
    s = InboxSettings(consumer="c", dead_letter_topic="d", retry_tiers=[1.0, 2.0])
    assert s.retry_topics("t") == ["t.retry.1", "t.retry.2"]


def test_the_runner_refuses_to_start_when_a_tier_topic_cannot_be_created(db, topics) -> None:
    s = InboxSettings(
        consumer="c1",
        dead_letter_topic=topics.dlq,
        retry_tiers=[1.0],
        retry_topic_format="{topic}.retry/{n}",  # not a valid topic name
    )
    connect = functools.partial(pymysql.connect, **DB, database=db.name)
    inbox = Inbox(s, connect, dead_letter_producer({"bootstrap.servers": BOOTSTRAP}))
    with pytest.raises(
        DeadLetterTopicError, match=r"retry tier topic .*retry/1.*retry_topic_format"
    ):
        InboxRunner(inbox, fail_until_tier, {"bootstrap.servers": BOOTSTRAP}, [topics.topic])
    inbox.close()


def copy_of(topic: str, partition: int, offset: int, headers: list, tier: int = 1):
    """A retry copy as a tier topic would deliver it (read at offset 0 of partition 0)."""
    extra = [
        ("retry_count", str(tier).encode()),
        ("retry_at", b"0"),
        ("original_topic", topic.encode()),
        ("original_partition", str(partition).encode()),
        ("original_offset", str(offset).encode()),
    ]
    return ParkedRecord(f"{topic}.retry.{tier}", 0, 0, b"order-1", b"{}", headers + extra)


def test_a_copy_of_an_applied_record_is_a_duplicate(db, topics) -> None:
    """A copy of a record whose effect committed (a crash after the commit, before the offset) is
    a duplicate: the handler does not run again."""
    s = InboxSettings(consumer="c1", dead_letter_topic=topics.dlq, retry_tiers=[1.0])
    connect = functools.partial(pymysql.connect, **DB, database=db.name)
    inbox = Inbox(s, connect, dead_letter_producer({"bootstrap.servers": BOOTSTRAP}))
    headers = record("e-1")["headers"]
    original = ParkedRecord(topics.topic, 1, 7, b"order-1", b"{}", headers)
    assert inbox.process(original, fail_until_tier).outcome is Outcome.PROCESSED
    copy = copy_of(topics.topic, 1, 7, headers)
    assert origin(copy) == (topics.topic, 1, 7)
    assert inbox.process(copy, fail_until_tier).outcome is Outcome.DUPLICATE
    inbox.close()
    assert db.query("SELECT COUNT(*) FROM coupons") == [(1,)]
    assert db.query("SELECT topic, kafka_partition, kafka_offset FROM outbox_inbox") == [
        (topics.topic, 1, 7)
    ]


def test_a_parked_record_failing_when_resumed_goes_to_tier_1(db, topics, tiers) -> None:
    """A parked version whose handler keeps failing when its predecessor resumes it is sent to
    tier 1 (outcome retried) and its parked row deleted."""
    ensure_topic({"bootstrap.servers": BOOTSTRAP}, tiers[0])
    s = InboxSettings(
        consumer="c1",
        dead_letter_topic=topics.dlq,
        version_header="version",
        max_attempts=2,
        backoff_initial=0.01,
        retry_tiers=[0.1],
    )
    outcomes: list[tuple] = []
    hooks = Hooks(after_commit=lambda rec, res: outcomes.append((res.outcome, rec.offset())))
    connect = functools.partial(pymysql.connect, **DB, database=db.name)
    inbox = Inbox(s, connect, dead_letter_producer({"bootstrap.servers": BOOTSTRAP}), hooks)
    v3 = failing("e-3", "order-1", 1)
    v3["headers"].append(("version", b"3"))

    def rec(offset: int, r: dict) -> ParkedRecord:
        return ParkedRecord(topics.topic, 0, offset, b"order-1", r["value"], r["headers"])

    v1, v2 = record("e-1", "order-1", version=1), record("e-2", "order-1", version=2)
    assert inbox.process(rec(0, v1), fail_until_tier).outcome is Outcome.PROCESSED
    assert inbox.process(rec(1, v3), fail_until_tier).outcome is Outcome.PARKED
    assert inbox.process(rec(2, v2), fail_until_tier).outcome is Outcome.PROCESSED
    inbox.close()
    assert sorted(outcomes[2:]) == sorted([(Outcome.RETRIED, 1), (Outcome.PROCESSED, 2)])
    assert db.query("SELECT COUNT(*) FROM outbox_inbox_parked") == [(0,)]
    (copy,) = topics.read(1, tiers[0], partitions(tiers[0]))
    h = headers_of(copy)
    assert (h["retry_count"], h["version"], h["original_offset"]) == ("1", "3", "1")


def test_a_version_gap_under_retry_goes_to_a_tier(db, topics, tiers) -> None:
    """Under gap_policy retry, a gap whose attempts run out is sent to tier 1, not dead-lettered."""
    ensure_topic({"bootstrap.servers": BOOTSTRAP}, tiers[0])
    s = InboxSettings(
        consumer="c1",
        dead_letter_topic=topics.dlq,
        version_header="version",
        gap_policy="retry",
        max_attempts=2,
        backoff_initial=0.01,
        retry_tiers=[0.1],
    )
    connect = functools.partial(pymysql.connect, **DB, database=db.name)
    inbox = Inbox(s, connect, dead_letter_producer({"bootstrap.servers": BOOTSTRAP}))
    v1, v3 = record("e-1", version=1), record("e-3", version=3)
    rec1 = ParkedRecord(topics.topic, 0, 0, b"order-1", v1["value"], v1["headers"])
    rec3 = ParkedRecord(topics.topic, 0, 1, b"order-1", v3["value"], v3["headers"])
    assert inbox.process(rec1, fail_until_tier).outcome is Outcome.PROCESSED
    result = inbox.process(rec3, fail_until_tier)
    inbox.close()
    assert (result.outcome, result.attempts) == (Outcome.RETRIED, 2)
    (copy,) = topics.read(1, tiers[0], partitions(tiers[0]))
    h = headers_of(copy)
    assert (h["retry_count"], h["retry_error"]) == ("1", "version gap: expected 2, got 3")
