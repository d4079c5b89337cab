"""Batch mode (inbox/CONTRACT.md, "Batch mode"): Inbox.process_batch and the runner with
batch_max_records > 1, against real MariaDB and MySQL 8.0 and Kafka."""

from __future__ import annotations

import threading
import uuid

import pymysql
import pytest
from confluent_kafka.admin import AdminClient
from support import BOOTSTRAP, TIMEOUT, Database, Topics, headers_of, record
from test_runner import committed

import outbox_inbox.inbox as inbox_module
from outbox_inbox import (
    Hooks,
    Inbox,
    InboxRunner,
    InboxSettings,
    Outcome,
    dead_letter_producer,
)


class Effects:
    """The business handler: one coupon row per record, in the inbox's transaction. Raises
    after the insert for the event keys in ``poison`` (proves the rollback); ``on_call(tx,
    key)`` runs first when set."""

    def __init__(self, poison: tuple[str, ...] = (), on_call=None) -> None:
        self.poison = set(poison)
        self.on_call = on_call
        self.calls: list[str] = []

    def __call__(self, tx, rec) -> None:
        headers = headers_of(rec)
        key = headers.get("event_key")
        self.calls.append(key)
        if self.on_call is not None:
            self.on_call(tx, key)
        with tx.cursor() as cur:
            cur.execute(
                "INSERT INTO coupons (consumer, order_id, event_key, version) VALUES (%s, %s, %s,"
                " %s)",
                ("c1", rec.key().decode(), key, headers.get("version")),
            )
        if key in self.poison:
            raise RuntimeError("poison record")


def make_inbox(db: Database, topics: Topics, hooks: Hooks | None = None, connect=None, **kw):
    settings = InboxSettings(
        consumer="c1",
        dead_letter_topic=topics.dlq,
        backoff_initial=0.01,
        backoff_max=0.05,
        **kw,
    )
    producer = dead_letter_producer({"bootstrap.servers": BOOTSTRAP})
    return Inbox(settings, connect or db.connect, producer, hooks)


def effects(db: Database) -> list[str]:
    return [row[0] for row in db.query("SELECT event_key FROM coupons ORDER BY id")]


def inbox_rows(db: Database) -> list[tuple]:
    return db.query(
        "SELECT CONVERT(consumer USING utf8mb4), CONVERT(event_key USING utf8mb4), topic,"
        " kafka_partition, kafka_offset, processed_at IS NOT NULL FROM outbox_inbox"
        " ORDER BY kafka_offset"
    )


def outcomes(results) -> list[tuple[str, str, int]]:
    return [(r.outcome.value, r.event_key, r.attempts) for r in results]


def test_batch_settings_are_validated() -> None:
    for bad in (0, 10001, -1):
        with pytest.raises(ValueError, match=rf"batch_max_records .*1 to 10000 \(got {bad}\)"):
            InboxSettings("c", "d", batch_max_records=bad)
    with pytest.raises(ValueError, match=r"batch_max_wait must not be negative \(got -0.001\)"):
        InboxSettings("c", "d", batch_max_wait=-0.001)
    s = InboxSettings("c", "d")
    assert (s.batch_max_records, s.batch_max_wait) == (1, 0.02)
    assert InboxSettings("c", "d", batch_max_records=10000).batch_max_records == 10000


def test_batch_of_new_records_is_processed_in_one_go(any_db, topics) -> None:
    db = any_db
    topics.produce([record(f"e-{i}", key=f"order-{i}") for i in range(51)])
    messages = topics.read(51)
    seen: list[tuple[str, str]] = []
    hooks = Hooks(
        before_commit=lambda r: seen.append(("before", headers_of(r)["event_key"])),
        after_commit=lambda r, res: seen.append((res.outcome.value, res.event_key)),
    )
    inbox = make_inbox(db, topics, hooks)
    handler = Effects()
    # One record through the single path: the batch's rows must look the same.
    assert inbox.process(messages[0], handler).outcome is Outcome.PROCESSED
    seen.clear()

    results = inbox.process_batch(messages[1:], handler)

    keys = [f"e-{i}" for i in range(1, 51)]
    assert outcomes(results) == [("processed", k, 1) for k in keys]
    assert seen == [("before", k) for k in keys] + [("processed", k) for k in keys]
    assert effects(db) == ["e-0", *keys]
    assert inbox_rows(db) == [("c1", f"e-{i}", topics.topic, 0, i, 1) for i in range(51)]
    # The same column types and defaults as the single path's row.
    types = db.query(
        "SELECT DISTINCT LENGTH(processed_at), MICROSECOND(processed_at) > -1 FROM outbox_inbox"
    )
    assert len(types) == 1
    inbox.close()


def test_batch_duplicates_in_the_inbox_and_within_the_batch(any_db, topics) -> None:
    db = any_db
    topics.produce([record(k, key="order-1") for k in ("e-0", "e-0", "e-1", "e-2", "e-1", "e-3")])
    first, *batch = topics.read(6)
    inbox = make_inbox(db, topics)
    handler = Effects()
    assert inbox.process(first, handler).outcome is Outcome.PROCESSED

    results = inbox.process_batch(batch, handler)

    assert outcomes(results) == [
        ("duplicate", "e-0", 1),
        ("processed", "e-1", 1),
        ("processed", "e-2", 1),
        ("duplicate", "e-1", 1),
        ("processed", "e-3", 1),
    ]
    assert effects(db) == ["e-0", "e-1", "e-2", "e-3"]
    assert [row[1] for row in inbox_rows(db)] == ["e-0", "e-1", "e-2", "e-3"]
    inbox.close()


def test_batch_keys_are_compared_byte_for_byte(any_db, topics) -> None:
    db = any_db
    twins = ["evt-a1B", "evt-A1b", "café", "cafe", "k", "k "]
    topics.produce([record(k, key="order-1") for k in twins])
    inbox = make_inbox(db, topics)
    results = inbox.process_batch(topics.read(len(twins)), Effects())
    assert outcomes(results) == [("processed", k, 1) for k in twins]
    assert effects(db) == twins
    inbox.close()


def test_batch_handler_error_splits_the_batch(any_db, topics) -> None:
    db = any_db
    keys = [f"e-{i}" for i in range(7)]
    topics.produce([record(k, key="order-1") for k in keys])
    inbox = make_inbox(db, topics, max_attempts=2)
    handler = Effects(poison=("e-3",))

    results = inbox.process_batch(topics.read(7), handler)

    assert [(r.outcome.value, r.event_key) for r in results] == [
        ("processed", "e-0"),
        ("processed", "e-1"),
        ("processed", "e-2"),
        ("dead_lettered", "e-3"),
        ("processed", "e-4"),
        ("processed", "e-5"),
        ("processed", "e-6"),
    ]
    assert [r.attempts for r in results] == [1, 1, 1, 2, 1, 1, 1]
    assert results[3].reason == "poison record"
    # The failed batch run was e-3's attempt 1: its handler ran max_attempts times in all.
    assert handler.calls.count("e-3") == 2
    # The rolled-back batch left nothing: every other effect exactly once, none of e-3.
    assert effects(db) == ["e-0", "e-1", "e-2", "e-4", "e-5", "e-6"]
    assert [row[1] for row in inbox_rows(db)] == ["e-0", "e-1", "e-2", "e-4", "e-5", "e-6"]
    (letter,) = topics.read(1, topics.dlq)
    h = headers_of(letter)
    assert (h["event_key"], h["dlq_attempts"], h["dlq_reason"]) == ("e-3", "2", "poison record")
    assert (h["dlq_topic"], h["dlq_offset"]) == (topics.topic, "3")
    inbox.close()


def test_batch_versions_stale_parked_and_resumed(any_db, topics) -> None:
    db = any_db
    topics.produce([record("b-5", key="order-B", version=5)])
    topics.produce(
        [
            record("a-1", key="order-A", version=1),
            record("a-2", key="order-A", version=2),
            record("a-4", key="order-A", version=4),
            record("a-3", key="order-A", version=3),
            record("b-3", key="order-B", version=3),
        ]
    )
    first, *batch = topics.read(6)
    reported: list[tuple[str, str]] = []
    hooks = Hooks(after_commit=lambda r, res: reported.append((res.outcome.value, res.event_key)))
    inbox = make_inbox(db, topics, hooks, version_header="version")
    handler = Effects()
    assert inbox.process(first, handler).outcome is Outcome.PROCESSED
    reported.clear()

    results = inbox.process_batch(batch, handler)

    assert [(r.outcome.value, r.event_key) for r in results] == [
        ("processed", "a-1"),
        ("processed", "a-2"),
        ("parked", "a-4"),
        ("processed", "a-3"),
        ("stale", "b-3"),
    ]
    assert results[2].reason == "version gap: expected 3, got 4"
    # after_commit of the batch in order, then the resumed v4 (as the single path reports it).
    assert reported == [
        ("processed", "a-1"),
        ("processed", "a-2"),
        ("parked", "a-4"),
        ("processed", "a-3"),
        ("stale", "b-3"),
        ("resumed", "a-4"),
    ]
    assert effects(db) == ["b-5", "a-1", "a-2", "a-3", "a-4"]
    versions = db.query(
        "SELECT CONVERT(aggregate_id USING utf8mb4), version FROM outbox_inbox_version"
        " ORDER BY aggregate_id"
    )
    assert versions == [("order-A", 4), ("order-B", 5)]
    assert db.query("SELECT COUNT(*) FROM outbox_inbox_parked") == [(0,)]
    # The stale record's inbox row stays (a redelivery is a duplicate); the resumed one's row
    # names the parked record's offset.
    assert [(row[1], row[4]) for row in inbox_rows(db)] == [
        ("b-5", 0),
        ("a-1", 1),
        ("a-2", 2),
        ("a-4", 3),
        ("a-3", 4),
        ("b-3", 5),
    ]
    inbox.close()


def test_batch_race_on_mysql_is_redone_and_found_duplicate(mysql_db, topics, monkeypatch) -> None:
    race_test(mysql_db, topics, monkeypatch)


def test_batch_race_on_mariadb_returning_reports_duplicate(db, topics, monkeypatch) -> None:
    race_test(db, topics, monkeypatch)


def race_test(db: Database, topics: Topics, monkeypatch) -> None:
    """Another transaction commits the inbox row of e-2 while the batch is between its
    duplicate-finding statement and its insert (MySQL: the SELECT ... FOR UPDATE and the INSERT,
    under READ COMMITTED; MariaDB: before the INSERT IGNORE ... RETURNING)."""
    keys = [f"e-{i}" for i in range(5)]
    topics.produce([record(k, key="order-1") for k in keys])
    calls: list[int] = []

    def other_transaction() -> None:
        calls.append(1)
        if len(calls) == 1:
            db.query(
                "INSERT INTO outbox_inbox (consumer, event_key, topic, kafka_partition,"
                " kafka_offset) VALUES ('c1', 'e-2', 'elsewhere', 9, 99)"
            )

    monkeypatch.setattr(inbox_module, "_test_hook_after_batch_select", other_transaction)

    def connect():
        return db.connect(init_command="SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")

    inbox = make_inbox(db, topics, connect=connect)
    results = inbox.process_batch(topics.read(5), Effects())

    assert outcomes(results) == [
        ("processed", "e-0", 1),
        ("processed", "e-1", 1),
        ("duplicate", "e-2", 1),
        ("processed", "e-3", 1),
        ("processed", "e-4", 1),
    ]
    # MySQL: the INSERT failed with 1062 and the batch was redone (the hook ran again).
    assert len(calls) == (2 if db.server == "mysql" else 1)
    assert effects(db) == ["e-0", "e-1", "e-3", "e-4"]
    assert db.query("SELECT topic FROM outbox_inbox WHERE event_key = 'e-2'") == [("elsewhere",)]
    inbox.close()


def test_batch_infrastructure_error_redoes_the_whole_batch(any_db, topics) -> None:
    db = any_db
    keys = [f"e-{i}" for i in range(5)]
    topics.produce([record(k, key="order-1") for k in keys])
    killed: list[int] = []

    def kill_own_connection(tx, key) -> None:
        if key == "e-2" and not killed:
            with tx.cursor() as cur:
                cur.execute("SELECT CONNECTION_ID()")
                (conn_id,) = cur.fetchone()
            killed.append(conn_id)
            db.query(f"KILL CONNECTION {int(conn_id)}")

    inbox = make_inbox(db, topics)
    handler = Effects(on_call=kill_own_connection)
    results = inbox.process_batch(topics.read(5), handler)

    assert len(killed) == 1
    assert outcomes(results) == [("processed", k, 1) for k in keys]
    # The first round's handlers ran (e-0, e-1, e-2 then the lost connection), the redo's all.
    assert handler.calls == ["e-0", "e-1", "e-2", *keys]
    assert effects(db) == keys
    inbox.close()


def test_batch_outage_past_the_budget_settles_nothing(db, topics) -> None:
    topics.produce([record(f"e-{i}", key="order-1") for i in range(3)])
    messages = topics.read(3)

    def refuse():
        raise pymysql.err.OperationalError(2003, "Can't connect (test)")

    inbox = make_inbox(db, topics, connect=refuse, outage_budget=0.2)
    seen: list = []
    inbox.hooks = Hooks(after_commit=lambda r, res: seen.append(res))
    with pytest.raises(inbox_module.OutageError, match=rf"{topics.topic}/0@0"):
        inbox.process_batch(messages, Effects())
    assert seen == []
    assert effects(db) == []


class Recording(Inbox):
    """An Inbox that records which path each record took."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.singles: list[str] = []
        self.batches: list[list[str]] = []

    def process(self, record, handler):
        self.singles.append(headers_of(record)["event_key"])
        return super().process(record, handler)

    def process_batch(self, records, handler):
        self.batches.append([headers_of(r)["event_key"] for r in records])
        return super().process_batch(records, handler)


def run_batch_runner(
    db: Database, topics: Topics, group: str, count: int, inbox: Inbox, before_run=None
) -> list[tuple[str, int]]:
    settled: list[tuple[str, int]] = []

    def on_settled(rec, result, _polled_at) -> None:
        settled.append((result.event_key, rec.offset()))
        if len(settled) == count:
            runner.stop()

    config = {"bootstrap.servers": BOOTSTRAP, "group.id": group, "auto.offset.reset": "earliest"}
    runner = InboxRunner(inbox, Effects(), config, [topics.topic], on_settled=on_settled)
    if before_run is not None:
        before_run()
    guard = threading.Timer(TIMEOUT, runner.stop)  # never hang the suite
    guard.start()
    try:
        runner.run()
    finally:
        guard.cancel()
        inbox.close()
    return settled


def test_runner_in_batch_mode_end_to_end(db, topics) -> None:
    topics.produce([record(f"e-{i}", key=f"order-{i}") for i in range(500)])
    group = f"inbox-python-g-{uuid.uuid4().hex[:8]}"
    settings = InboxSettings(consumer="c1", dead_letter_topic=topics.dlq, batch_max_records=100)
    inbox = Recording(settings, db.connect, dead_letter_producer({"bootstrap.servers": BOOTSTRAP}))

    settled = run_batch_runner(db, topics, group, 500, inbox)

    assert [offset for _, offset in settled] == list(range(500))
    assert db.query("SELECT COUNT(*), COUNT(DISTINCT event_key) FROM coupons") == [(500, 500)]
    assert committed(group, topics.topic) == 500
    assert inbox.singles == []
    assert max(len(b) for b in inbox.batches) <= 100
    assert len(inbox.batches) < 500  # batched, not one by one
    assert sum(len(b) for b in inbox.batches) == 500


def test_runner_in_batch_mode_sends_a_retry_copy_through_the_single_path(db, topics) -> None:
    tier = f"{topics.topic}.retry.1"
    settings = InboxSettings(
        consumer="c1",
        dead_letter_topic=topics.dlq,
        batch_max_records=100,
        retry_tiers=[0.05],
    )
    inbox = Recording(settings, db.connect, dead_letter_producer({"bootstrap.servers": BOOTSTRAP}))
    group = f"inbox-python-g-{uuid.uuid4().hex[:8]}"
    copy = record("e-copy", key="order-9")
    copy["headers"] += [
        ("retry_count", b"1"),
        ("retry_at", b"1000"),  # long due
        ("original_topic", topics.topic.encode()),
        ("original_partition", b"0"),
        ("original_offset", b"7"),
    ]
    copy.pop("partition")

    def produce() -> None:  # the runner created the tier topic
        topics.produce([record(f"e-{i}", key=f"order-{i}") for i in range(3)])
        topics.produce([copy], topic=tier)

    try:
        settled = run_batch_runner(db, topics, group, 4, inbox, before_run=produce)
    finally:
        admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
        for future in admin.delete_topics([tier]).values():
            future.result(TIMEOUT)
    assert sorted(key for key, _ in settled) == ["e-0", "e-1", "e-2", "e-copy"]
    assert inbox.singles == ["e-copy"]
    assert sorted(k for b in inbox.batches for k in b) == ["e-0", "e-1", "e-2"]
    rows = db.query(
        "SELECT topic, kafka_partition, kafka_offset FROM outbox_inbox WHERE event_key = 'e-copy'"
    )
    assert rows == [(topics.topic, 0, 7)]
    assert sorted(effects(db)) == ["e-0", "e-1", "e-2", "e-copy"]
