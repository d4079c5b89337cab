"""Helpers for the tests against the real MariaDB/MySQL and Kafka (no mocks).

Connection settings: INBOX_TEST_DB_HOST (127.0.0.1), INBOX_TEST_DB_PORT (3306), INBOX_TEST_DB_USER
(root), INBOX_TEST_DB_PASSWORD (empty), INBOX_TEST_BOOTSTRAP (127.0.0.1:9092); the batch-mode
tests also need MySQL 8.0 on INBOX_TEST_MYSQL_PORT (3326; same host, user and password) and
fail when it cannot be reached. Every test gets its
own database (``inbox_python_<random>``, dropped afterwards) and topics (``inbox-python-<random>``,
deleted afterwards).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pymysql
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, Producer, TopicPartition

MIGRATIONS = [
    Path(__file__).resolve().parents[3] / "migrations" / name
    for name in ("0004_inbox.sql", "0006_inbox_parked.sql")
]
BOOTSTRAP = os.environ.get("INBOX_TEST_BOOTSTRAP", "127.0.0.1:9092")
DB = {
    "host": os.environ.get("INBOX_TEST_DB_HOST", "127.0.0.1"),
    "port": int(os.environ.get("INBOX_TEST_DB_PORT", "3306")),
    "user": os.environ.get("INBOX_TEST_DB_USER", "root"),
    "password": os.environ.get("INBOX_TEST_DB_PASSWORD", ""),
    "charset": "utf8mb4",
}
# MySQL 8.0 for the batch-mode tests whose statements differ from MariaDB's: same host, user and
# password, port INBOX_TEST_MYSQL_PORT (3326).
MYSQL_DB = {**DB, "port": int(os.environ.get("INBOX_TEST_MYSQL_PORT", "3326"))}
COUPONS = (
    "CREATE TABLE coupons (id BIGINT AUTO_INCREMENT PRIMARY KEY, consumer VARCHAR(191),"
    " order_id VARCHAR(255), event_key VARCHAR(255), version BIGINT NULL)"
)
TIMEOUT = 60.0


def wait_until(predicate: Callable[[], object], what: str, timeout: float = TIMEOUT) -> object:
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def create_table_statements() -> list[str]:
    """The ``CREATE TABLE`` statements of the inbox migrations (0004, then 0006: parked rows),
    without their comments (which may hold a semicolon)."""
    statements = []
    for path in MIGRATIONS:
        lines = [line for line in path.read_text().splitlines() if not line.startswith("--")]
        statements += [s for s in "\n".join(lines).split(";") if "CREATE TABLE" in s]
    return statements


@dataclass
class Database:
    name: str
    connect: Callable[..., pymysql.connections.Connection]
    server: str = "mariadb"
    """``mariadb`` (INBOX_TEST_DB_PORT) or ``mysql`` (INBOX_TEST_MYSQL_PORT)."""

    def query(self, sql: str, *args: object) -> list[tuple]:
        conn = self.connect(autocommit=True)
        try:
            with conn.cursor() as cur:
                cur.execute(sql, args or None)
                return list(cur.fetchall())
        finally:
            conn.close()


@dataclass
class Topics:
    topic: str
    dlq: str

    def produce(self, records: list[dict], topic: str | None = None) -> None:
        """Produce ``{"key", "value", "headers", "partition"?}`` dicts and wait for the acks."""
        errors: list[object] = []
        producer = Producer({"bootstrap.servers": BOOTSTRAP, "acks": "all"})
        for r in records:
            extra = {"partition": r["partition"]} if "partition" in r else {}
            producer.produce(
                topic or self.topic,
                key=r.get("key"),
                value=r.get("value"),
                headers=r.get("headers"),
                on_delivery=lambda err, _msg: err and errors.append(err),
                **extra,
            )
        assert producer.flush(TIMEOUT) == 0, "records not delivered"
        assert not errors, errors

    def read(self, count: int, topic: str | None = None, partitions: int = 1) -> list[Message]:
        """Read the first ``count`` records of ``topic`` (default: the main topic)."""
        consumer = Consumer(
            {
                "bootstrap.servers": BOOTSTRAP,
                "group.id": f"inbox-python-reader-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
            }
        )
        consumer.assign(
            [TopicPartition(topic or self.topic, p, OFFSET_BEGINNING) for p in range(partitions)]
        )
        records: list[Message] = []
        deadline = time.monotonic() + TIMEOUT
        try:
            while len(records) < count and time.monotonic() < deadline:
                msg = consumer.poll(0.2)
                if msg is not None and msg.error() is None:
                    records.append(msg)
        finally:
            consumer.close()
        assert len(records) == count, f"read {len(records)} of {count} records"
        return records


def record(
    event_key: str | None,
    key: str = "order-1",
    *,
    version: int | str | None = None,
    value: bytes = b'{"order_id":"order-1"}',
    partition: int = 0,
) -> dict:
    """A record as the relay produces it (``event_key=None``: no such header)."""
    headers = [("id", b"1"), ("event_type", b"OrderPlaced"), ("aggregate_type", b"order")]
    if event_key is not None:
        headers.append(("event_key", event_key.encode()))
    if version is not None:
        headers.append(("version", str(version).encode()))
    return {"key": key.encode(), "value": value, "headers": headers, "partition": partition}


def headers_of(message: Message) -> dict[str, str]:
    return {k: (v or b"").decode() for k, v in message.headers() or []}
