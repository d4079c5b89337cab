"""InboxRunner and the scenario consumer against the real database and Kafka."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from support import BOOTSTRAP, DB, TIMEOUT, Database, Topics, headers_of, record, wait_until

from outbox_inbox import (
    DeadLetterTopicError,
    Inbox,
    InboxRunner,
    InboxSettings,
    dead_letter_producer,
)


def grant(tx, rec) -> None:
    with tx.cursor() as cur:
        cur.execute(
            "INSERT INTO coupons (consumer, order_id, event_key) VALUES (%s, %s, %s)",
            ("c1", rec.key().decode(), headers_of(rec)["event_key"]),
        )


def committed(group: str, topic: str, partition: int = 0) -> int:
    consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": group})
    try:
        (tp,) = consumer.committed([TopicPartition(topic, partition)], timeout=TIMEOUT)
        return tp.offset
    finally:
        consumer.close()


def run_until(db: Database, topics: Topics, group: str, settled_count: int) -> list[int]:
    """Run a runner in this thread until it settled ``settled_count`` records; their offsets."""
    settings = InboxSettings(consumer="c1", dead_letter_topic=topics.dlq)
    inbox = Inbox(settings, db.connect, dead_letter_producer({"bootstrap.servers": BOOTSTRAP}))
    settled: list[int] = []

    def on_settled(rec, _result, _polled_at) -> None:
        settled.append(rec.offset())
        if len(settled) == settled_count:
            runner.stop()

    config = {"bootstrap.servers": BOOTSTRAP, "group.id": group, "auto.offset.reset": "earliest"}
    runner = InboxRunner(inbox, grant, config, [topics.topic], on_settled=on_settled)
    guard = threading.Timer(TIMEOUT, runner.stop)  # never hang the suite
    guard.start()
    try:
        runner.run()
    finally:
        guard.cancel()
        inbox.close()
    return settled


def test_runner_commits_only_settled_offsets(db, topics) -> None:
    topics.produce([record(f"e-{i}", key=f"order-{i}") for i in range(10)])
    group = f"inbox-python-g-{uuid.uuid4().hex[:8]}"

    # Stopped after 4 records (more were fetched): only those 4 are committed.
    assert run_until(db, topics, group, 4) == [0, 1, 2, 3]
    assert committed(group, topics.topic) == 4

    # A second consumer of the group goes on exactly there, and commits the rest.
    assert run_until(db, topics, group, 6) == [4, 5, 6, 7, 8, 9]
    assert committed(group, topics.topic) == 10
    assert db.query("SELECT COUNT(*), COUNT(DISTINCT event_key) FROM coupons") == [(10, 10)]


class Program:
    """The scenario consumer as a child process; stdout lines collected by a thread."""

    def __init__(self, env: dict[str, str]) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "outbox_inbox.examples.scenario_consumer"],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def outcomes(self) -> list[list[str]]:
        return [line.split()[1:] for line in self.lines if line.startswith("OUTCOME ")]

    def wait(self) -> int:
        return self.proc.wait(TIMEOUT)


def test_scenario_consumer_crash_after_db_commit_then_duplicate(db, topics, tmp_path) -> None:
    topics.produce([record(f"order-{i}-1", key=f"order-{i}") for i in (1, 2, 3)])
    env = {
        "INBOX_BOOTSTRAP": BOOTSTRAP,
        "INBOX_DB_HOST": DB["host"],
        "INBOX_DB_PORT": str(DB["port"]),
        "INBOX_DB_USER": DB["user"],
        "INBOX_DB_PASSWORD": DB["password"],
        "INBOX_DB_NAME": db.name,
        "INBOX_TOPIC": topics.topic,
        "INBOX_GROUP": f"inbox-python-g-{uuid.uuid4().hex[:8]}",
        "INBOX_CONSUMER": "scenario",
        "INBOX_DLQ_TOPIC": topics.dlq,
        "INBOX_CRASH_POINT": "after_db_commit",
        "INBOX_CRASH_EVENT_KEY": "order-2-1",
        "INBOX_CRASH_MARKER": str(tmp_path / "crashed"),
    }

    first = Program(env)
    assert first.wait() == 137
    assert first.lines[0] == "READY"
    assert ["processed", "order-1-1", "0", "0", "1"] in first.outcomes()
    # OUTCOME is printed from after_commit, right before the crash in the same hook: order-2-1
    # was committed in the database, its offset not, and nothing after it was settled.
    assert first.outcomes()[-1] == ["processed", "order-2-1", "0", "1", "1"]
    assert not [o for o in first.outcomes() if o[1] == "order-3-1"]
    assert (tmp_path / "crashed").exists()

    second = Program(env)
    wait_until(lambda: any(o[1] == "order-3-1" for o in second.outcomes()), "order-3-1 settled")
    second.proc.send_signal(signal.SIGTERM)
    assert second.wait() == 0
    outcomes = {o[1]: o for o in second.outcomes()}
    assert outcomes["order-2-1"] == ["duplicate", "order-2-1", "0", "1", "1"]
    assert outcomes["order-3-1"] == ["processed", "order-3-1", "0", "2", "1"]
    rows = db.query("SELECT event_key, COUNT(*) FROM coupons GROUP BY event_key ORDER BY event_key")
    assert rows == [("order-1-1", 1), ("order-2-1", 1), ("order-3-1", 1)]


def test_runner_creates_a_missing_dead_letter_topic(db, topics) -> None:
    fresh = Topics(topics.topic, f"inbox-python-fresh-dlq-{uuid.uuid4().hex[:12]}")
    topics.produce([record(None, key="order-x")])  # no event_key: dead-lettered at once
    settings = InboxSettings(consumer="c1", dead_letter_topic=fresh.dlq)
    inbox = Inbox(settings, db.connect, dead_letter_producer({"bootstrap.servers": BOOTSTRAP}))
    group = f"inbox-python-g-{uuid.uuid4().hex[:8]}"
    config = {"bootstrap.servers": BOOTSTRAP, "group.id": group, "auto.offset.reset": "earliest"}
    try:
        runner = InboxRunner(
            inbox, grant, config, [topics.topic], on_settled=lambda *_: runner.stop()
        )
        guard = threading.Timer(TIMEOUT, runner.stop)  # never hang the suite
        guard.start()
        try:
            runner.run()
        finally:
            guard.cancel()
        (dead,) = fresh.read(1, topic=fresh.dlq)
        assert headers_of(dead)["dlq_reason"] == "missing event_key header"
    finally:
        inbox.close()
        AdminClient({"bootstrap.servers": BOOTSTRAP}).delete_topics([fresh.dlq])


def test_runner_refuses_a_dead_letter_topic_the_broker_will_not_create(db, topics) -> None:
    bad = f"inbox-python-bad/dlq-{uuid.uuid4().hex[:8]}"  # '/' is not allowed in a topic name
    inbox = Inbox(
        InboxSettings(consumer="c1", dead_letter_topic=bad),
        db.connect,
        dead_letter_producer({"bootstrap.servers": BOOTSTRAP}),
    )
    try:
        with pytest.raises(DeadLetterTopicError) as refused:
            InboxRunner(inbox, grant, {"bootstrap.servers": BOOTSTRAP}, [topics.topic])
        assert bad in str(refused.value) and "kafka-topics.sh --create" in str(refused.value)
    finally:
        inbox.close()
