"""Per-topic settings (inbox/CONTRACT.md, "Per-topic settings") against the real database and
Kafka."""

from __future__ import annotations

import contextlib
import functools
import threading
import uuid

import pymysql
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from support import BOOTSTRAP, DB, TIMEOUT, Topics, headers_of, record, wait_until

from outbox_inbox import (
    GapPolicy,
    Inbox,
    InboxRunner,
    InboxSettings,
    Outcome,
    TopicSettings,
    dead_letter_producer,
)
from outbox_inbox.inbox import ParkedRecord


class Failing:
    """A handler that always fails, counting its calls per event key."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def __call__(self, _tx, rec) -> None:
        key = headers_of(rec)["event_key"]
        self.calls[key] = self.calls.get(key, 0) + 1
        raise RuntimeError(f"failing {key}")


def ok(tx, rec) -> None:
    with tx.cursor() as cur:
        cur.execute(
            "INSERT INTO coupons (consumer, order_id, event_key) VALUES (%s, %s, %s)",
            ("c1", rec.key().decode(), headers_of(rec)["event_key"]),
        )


def make_inbox(db, t: Topics, **settings) -> Inbox:
    s = InboxSettings(
        **{
            "consumer": "c1",
            "dead_letter_topic": t.dlq,
            "backoff_initial": 0.01,
            "backoff_max": 0.02,
            **settings,
        }
    )
    connect = functools.partial(pymysql.connect, **DB, database=db.name)
    return Inbox(s, connect, dead_letter_producer({"bootstrap.servers": BOOTSTRAP}))


def at(topic: str, offset: int, r: dict) -> ParkedRecord:
    """``r`` as read from ``topic`` partition 0 at ``offset``."""
    return ParkedRecord(topic, 0, offset, r["key"], r["value"], r["headers"])


def test_for_topic_inherits_and_overrides() -> None:
    s = InboxSettings(
        consumer="c",
        dead_letter_topic="d",
        max_attempts=3,
        retry_tiers=[1.0, 2.0],
        topics={
            "orders": TopicSettings(max_attempts=8, gap_deadline=60.0, inbox_retention=86400.0),
            "notifications": TopicSettings(retry_tiers=[], gap_policy="dead_letter"),
        },
    )
    orders, notifications, other = (s.for_topic(t) for t in ("orders", "notifications", "x"))
    assert (orders.max_attempts, orders.retry_tiers, orders.gap_deadline) == (8, (1.0, 2.0), 60.0)
    assert (orders.inbox_retention, other.inbox_retention) == (86400.0, 7 * 24 * 3600.0)
    assert (notifications.max_attempts, notifications.retry_tiers) == (3, ())
    assert notifications.gap_policy is GapPolicy.DEAD_LETTER
    assert (other.max_attempts, other.gap_policy, other.gap_deadline) == (3, GapPolicy.PARK, 3600.0)
    assert s.retry_topics("orders") == ["orders.retry.1", "orders.retry.2"]
    assert s.retry_topics("notifications") == []


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"max_attempts": 0}, r"topics\['orders'\]\.max_attempts"),
        ({"backoff_initial": -1.0}, r"topics\['orders'\]\.backoff_initial must not be negative"),
        ({"backoff_initial": 20.0}, r"topics\['orders'\]\.backoff_initial .*\.backoff_max"),
        ({"backoff_max": 0.01}, r"topics\['orders'\]\.backoff_initial .*\.backoff_max"),
        ({"retry_tiers": [1.0, -1.0]}, r"topics\['orders'\]\.retry_tiers"),
        ({"gap_policy": "drop"}, r"topics\['orders'\]\.gap_policy"),
        ({"gap_deadline": -1.0}, r"topics\['orders'\]\.gap_deadline"),
        ({"inbox_retention": 0.0}, r"topics\['orders'\]\.inbox_retention"),
    ],
)
def test_topic_settings_are_validated_naming_the_topic_and_field(overrides, message) -> None:
    with pytest.raises(ValueError, match=message):
        InboxSettings(
            consumer="c", dead_letter_topic="d", topics={"orders": TopicSettings(**overrides)}
        )


def test_consumer_wide_settings_follow_the_same_rules() -> None:
    with pytest.raises(ValueError, match=r"^backoff_initial .* backoff_max"):
        InboxSettings(consumer="c", dead_letter_topic="d", backoff_initial=2.0, backoff_max=1.0)
    with pytest.raises(ValueError, match=r"^inbox_retention"):
        InboxSettings(consumer="c", dead_letter_topic="d", inbox_retention=-1.0)
    with pytest.raises(ValueError, match="lacks"):
        InboxSettings(
            consumer="c",
            dead_letter_topic="d",
            retry_topic_format="x",
            topics={"orders": TopicSettings(retry_tiers=[1.0])},
        )
    with pytest.raises(TypeError, match="orders"):
        InboxSettings(consumer="c", dead_letter_topic="d", topics={"orders": {"max_attempts": 2}})


def test_max_attempts_per_topic(db, topics) -> None:
    """One topic dead-letters after 1 attempt, another (the consumer-wide value) after 3."""
    inbox = make_inbox(db, topics, max_attempts=3, topics={"fast": TopicSettings(max_attempts=1)})
    handler = Failing()
    first = inbox.process(at("fast", 0, record("e-fast")), handler)
    second = inbox.process(at("slow", 0, record("e-slow")), handler)
    inbox.close()
    assert (first.outcome, first.attempts) == (Outcome.DEAD_LETTERED, 1)
    assert (second.outcome, second.attempts) == (Outcome.DEAD_LETTERED, 3)
    assert handler.calls == {"e-fast": 1, "e-slow": 3}
    letters = [headers_of(m) for m in topics.read(2, topics.dlq)]
    assert [(h["dlq_topic"], h["dlq_attempts"]) for h in letters] == [("fast", "1"), ("slow", "3")]


def test_a_retry_copy_uses_its_original_topics_settings(db, topics) -> None:
    """A copy in tier 1 of ``orders`` (its last tier) is processed with ``orders``' max_attempts
    and tiers, not those of the tier topic (the consumer-wide ones): dead-lettered after 1."""
    inbox = make_inbox(
        db,
        topics,
        max_attempts=3,
        topics={"orders": TopicSettings(max_attempts=1, retry_tiers=[0.1])},
    )
    copy = record("e-1")
    copy["headers"] += [
        ("retry_count", b"1"),
        ("retry_at", b"0"),
        ("original_topic", b"orders"),
        ("original_partition", b"0"),
        ("original_offset", b"5"),
    ]
    handler = Failing()
    result = inbox.process(at("orders.retry.1", 0, copy), handler)
    inbox.close()
    assert (result.outcome, result.attempts, handler.calls) == (
        Outcome.DEAD_LETTERED,
        1,
        {"e-1": 1},
    )
    (letter,) = topics.read(1, topics.dlq)
    h = headers_of(letter)
    assert (h["dlq_topic"], h["dlq_offset"], h["dlq_attempts"]) == ("orders", "5", "1")


def test_gap_policy_and_gap_deadline_per_topic(db, topics) -> None:
    """A gap in ``parking`` is parked with that topic's deadline; one in ``strict`` is
    dead-lettered at once (its gap_policy), the consumer-wide policy being park."""
    inbox = make_inbox(
        db,
        topics,
        version_header="version",
        topics={
            "parking": TopicSettings(gap_deadline=120.0),
            "strict": TopicSettings(gap_policy="dead_letter"),
        },
    )
    a1, a3 = record("a-1", "A", version=1), record("a-3", "A", version=3)
    b1, b3 = record("b-1", "B", version=1), record("b-3", "B", version=3)
    assert inbox.process(at("parking", 0, a1), ok).outcome is Outcome.PROCESSED
    parked = inbox.process(at("parking", 1, a3), ok)
    assert inbox.process(at("strict", 0, b1), ok).outcome is Outcome.PROCESSED
    dead = inbox.process(at("strict", 1, b3), ok)
    inbox.close()
    assert (parked.outcome, parked.reason) == (Outcome.PARKED, "version gap: expected 2, got 3")
    assert (dead.outcome, dead.reason) == (Outcome.DEAD_LETTERED, "version gap: expected 2, got 3")
    assert db.query(
        "SELECT topic, TIMESTAMPDIFF(SECOND, parked_at, expires_at) FROM outbox_inbox_parked"
    ) == [("parking", 120)]
    (letter,) = topics.read(1, topics.dlq)
    assert (headers_of(letter)["dlq_topic"], headers_of(letter)["event_key"]) == ("strict", "b-3")


@pytest.fixture
def two_topics():
    """Two one-partition topics and a dead-letter topic; deleted afterwards with the tier
    topics the runner created."""
    base = f"inbox-python-pt-{uuid.uuid4().hex[:10]}"
    names = [f"{base}-a", f"{base}-b", f"{base}-dlq"]
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    for future in admin.create_topics([NewTopic(n, 1, 1) for n in names]).values():
        future.result(TIMEOUT)
    wait_until(
        lambda: all(n in admin.list_topics(timeout=10).topics for n in names), "topics created"
    )
    yield names
    known = admin.list_topics(timeout=10).topics
    doomed = [n for n in known if n.startswith(base)]
    for future in admin.delete_topics(doomed).values():
        with contextlib.suppress(Exception):
            future.result(TIMEOUT)


def test_the_runner_uses_each_topics_own_tiers(db, two_topics) -> None:
    """Consumer-wide one tier; topic a two, topic b none (``retry_tiers=[]``): the runner
    creates and subscribes to a's two tier topics and none of b's; a record failing in a goes
    through both tiers, one failing in b is dead-lettered at once."""
    a, b, dlq = two_topics
    topics = Topics(a, dlq)
    topics.produce([record("e-a")])
    topics.produce([record("e-b")], b)
    s = InboxSettings(
        consumer="c1",
        dead_letter_topic=dlq,
        max_attempts=1,
        backoff_initial=0.01,
        backoff_max=0.02,
        retry_tiers=[0.1],
        topics={a: TopicSettings(retry_tiers=[0.1, 0.1]), b: TopicSettings(retry_tiers=[])},
    )
    connect = functools.partial(pymysql.connect, **DB, database=db.name)
    inbox = Inbox(s, connect, dead_letter_producer({"bootstrap.servers": BOOTSTRAP}))
    settled: list[tuple] = []
    runner = InboxRunner(
        inbox,
        Failing(),
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": f"inbox-python-g-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "topic.metadata.refresh.interval.ms": 1000,
        },
        [a, b],
        poll_timeout=0.1,
        on_settled=lambda rec, res, _t: settled.append((res.event_key, res.outcome, rec.topic())),
    )
    known = AdminClient({"bootstrap.servers": BOOTSTRAP}).list_topics(timeout=10).topics
    assert f"{a}.retry.1" in known and f"{a}.retry.2" in known
    assert f"{b}.retry.1" not in known
    errors: list[BaseException] = []

    def run() -> None:
        try:
            runner.run()
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: len(settled) >= 4, "four settlements")
    finally:
        runner.stop()
        thread.join(TIMEOUT)
        inbox.close()
    assert not errors, errors
    assert [s for s in settled if s[0] == "e-a"] == [
        ("e-a", Outcome.RETRIED, a),
        ("e-a", Outcome.RETRIED, f"{a}.retry.1"),
        ("e-a", Outcome.DEAD_LETTERED, f"{a}.retry.2"),
    ]
    assert [s for s in settled if s[0] == "e-b"] == [("e-b", Outcome.DEAD_LETTERED, b)]
