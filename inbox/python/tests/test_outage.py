"""An infrastructure error is not a failed attempt (inbox/CONTRACT.md, "Attempts and outages").

The database is made unreachable through a TCP proxy of the test's own (the shared server keeps
running): the proxy's listener is closed and its connections cut, then it listens again on the
same port.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import threading
import time
import uuid

import pymysql
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from support import BOOTSTRAP, DB, TIMEOUT, Database, Topics, headers_of, record, wait_until

from outbox_inbox import (
    Inbox,
    InboxRunner,
    InboxSettings,
    OutageError,
    dead_letter_producer,
    is_infrastructure_error,
)


class DbProxy:
    """Forwards a local port to the database server. :meth:`down` closes the listener (new
    connections are refused) and cuts the open connections; :meth:`up` listens again on the
    same port."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.port = self._listen(0)

    def _listen(self, port: int) -> int:
        listener = socket.create_server(("127.0.0.1", port), reuse_port=False)
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return listener.getsockname()[1]

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by down()
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets.update((client, server))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def down(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            sockets, self._sockets = self._sockets, set()
        if listener is not None:
            listener.close()
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

        def refused() -> bool:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            except OSError:
                return True
            return False

        wait_until(refused, "the proxy port to refuse")

    def up(self) -> None:
        def bound() -> bool:
            try:
                self._listen(self.port)
            except OSError:
                return False
            return True

        wait_until(bound, "the proxy port to bind again")


@pytest.fixture
def proxy():
    p = DbProxy((DB["host"], DB["port"]))
    yield p
    p.down()


def committed(group: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": group})
    try:
        (tp,) = consumer.committed([TopicPartition(topic, 0)], timeout=TIMEOUT)
        return tp.offset
    finally:
        consumer.close()


def dead_letters(topics: Topics) -> int:
    consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "inbox-python-watermarks"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topics.dlq, 0), timeout=TIMEOUT)
        return high - low
    finally:
        consumer.close()


def grant(tx, rec) -> None:
    with tx.cursor() as cur:
        cur.execute(
            "INSERT INTO coupons (consumer, order_id, event_key) VALUES (%s, %s, %s)",
            ("c1", rec.key().decode(), headers_of(rec)["event_key"]),
        )


class Running:
    """An InboxRunner on its own thread, its database reached through the proxy."""

    def __init__(self, db: Database, topics: Topics, proxy: DbProxy, group: str, **settings):
        connect = functools.partial(
            pymysql.connect, **{**DB, "port": proxy.port}, database=db.name, connect_timeout=5
        )
        s = InboxSettings(
            **{
                "consumer": "c1",
                "dead_letter_topic": topics.dlq,
                "max_attempts": 3,
                "backoff_initial": 0.01,
                "backoff_max": 0.02,
                **settings,
            }
        )
        self.inbox = Inbox(s, connect, dead_letter_producer({"bootstrap.servers": BOOTSTRAP}))
        config = {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": group,
            "auto.offset.reset": "earliest",
        }
        self.runner = InboxRunner(self.inbox, grant, config, [topics.topic], poll_timeout=0.1)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.runner.run()
        except BaseException as error:
            self.error = error
        finally:
            self.inbox.close()

    def stop(self) -> None:
        self.runner.stop()
        self.join()

    def join(self) -> None:
        self.thread.join(TIMEOUT)
        assert not self.thread.is_alive(), "the runner did not stop"


def produce(topics: Topics, start: int, end: int) -> None:
    topics.produce([record(f"e-{i}", key=f"order-{i}") for i in range(start, end)])


def effects(db: Database) -> list[tuple]:
    return db.query("SELECT event_key, COUNT(*) FROM coupons GROUP BY event_key ORDER BY event_key")


def once(n: int) -> list[tuple]:
    return sorted((f"e-{i}", 1) for i in range(n))


def test_outage_is_not_a_failed_attempt(db, topics, proxy) -> None:
    """The database is unreachable for far longer than max_attempts x backoff (3 attempts, waits
    of 10 and 20 ms) while records arrive; once it is back every record is processed once, none
    is dead-lettered, and the offsets are committed."""
    group = f"inbox-python-g-{uuid.uuid4().hex[:8]}"
    running = Running(db, topics, proxy, group)
    produce(topics, 0, 3)
    wait_until(lambda: committed(group, topics.topic) == 3, "offset 3 committed")

    proxy.down()
    produce(topics, 3, 8)
    # The outage itself lasts a fixed time (the stimulus, not a wait for a result): 2 s, about
    # 70 times the old retry budget.
    time.sleep(2.0)
    assert committed(group, topics.topic) == 3, "committed during the outage"
    proxy.up()

    wait_until(lambda: committed(group, topics.topic) == 8, "offset 8 committed")
    running.stop()
    assert running.error is None
    assert effects(db) == once(8)
    assert dead_letters(topics) == 0


def test_outage_longer_than_the_budget_stops_the_runner(db, topics, proxy) -> None:
    """An outage longer than the outage budget stops the runner with OutageError, nothing past
    the last processed record committed; a restarted runner processes the rest once."""
    group = f"inbox-python-g-{uuid.uuid4().hex[:8]}"
    running = Running(db, topics, proxy, group, outage_budget=1.0)
    produce(topics, 0, 3)
    wait_until(lambda: committed(group, topics.topic) == 3, "offset 3 committed")

    proxy.down()
    produce(topics, 3, 6)
    running.join()
    assert isinstance(running.error, OutageError), repr(running.error)
    assert (running.error.topic, running.error.partition, running.error.offset) == (
        topics.topic,
        0,
        3,
    )
    assert is_infrastructure_error(running.error.__cause__)
    assert committed(group, topics.topic) == 3, "committed after the outage"
    proxy.up()

    restarted = Running(db, topics, proxy, group)
    wait_until(lambda: committed(group, topics.topic) == 6, "offset 6 committed")
    restarted.stop()
    assert restarted.error is None
    assert effects(db) == once(6)
    assert dead_letters(topics) == 0


def test_an_outage_never_sends_a_record_to_a_retry_tier(db, topics, proxy) -> None:
    """With retry tiers and a single attempt, an outage sends no record to a tier (nor to the
    dead-letter topic): once the database is back every record is processed once in its
    topic."""
    tier = topics.topic + ".retry.1"
    group = f"inbox-python-g-{uuid.uuid4().hex[:8]}"
    try:
        running = Running(db, topics, proxy, group, max_attempts=1, retry_tiers=[0.1])
        produce(topics, 0, 3)
        wait_until(lambda: committed(group, topics.topic) == 3, "offset 3 committed")

        proxy.down()
        produce(topics, 3, 6)
        time.sleep(2.0)  # the outage (the stimulus): far longer than one attempt's backoff
        assert committed(group, topics.topic) == 3, "committed during the outage"
        proxy.up()

        wait_until(lambda: committed(group, topics.topic) == 6, "offset 6 committed")
        running.stop()
        assert running.error is None
        assert effects(db) == once(6)
        assert end_offset(tier) == 0, "retry copies"
        assert dead_letters(topics) == 0
    finally:
        delete_topics([tier])


def end_offset(topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "inbox-python-watermarks"})
    try:
        metadata = consumer.list_topics(topic, timeout=TIMEOUT).topics[topic]
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=TIMEOUT)[1]
            for p in metadata.partitions
        )
    finally:
        consumer.close()


def delete_topics(names: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    for future in admin.delete_topics(names).values():
        with contextlib.suppress(Exception):
            future.result(TIMEOUT)


def test_infrastructure_errors_are_classified_by_code() -> None:
    for code in (1205, 1213, 1290, 1836, 1053, 1077, 1927, 4031, 2002, 2003, 2006, 2013, 2055):
        assert is_infrastructure_error(pymysql.err.OperationalError(code, "m")), code
    for code in (1062, 1146, 1064):
        assert not is_infrastructure_error(pymysql.err.OperationalError(code, "m")), code
    assert is_infrastructure_error(pymysql.err.InterfaceError(0, ""))
    assert is_infrastructure_error(ConnectionRefusedError())
    # A handler's own error counts as an attempt, unless raised from an infrastructure error.
    assert not is_infrastructure_error(ValueError("poison record"))
    try:
        try:
            raise pymysql.err.OperationalError(1213, "Deadlock found")
        except pymysql.err.OperationalError as deadlock:
            raise RuntimeError("grant failed") from deadlock
    except RuntimeError as wrapped:
        assert is_infrastructure_error(wrapped)
