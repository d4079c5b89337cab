"""Fixtures: a fresh database and fresh topics per test (see support.py for the settings)."""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import Iterator

import pymysql
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from support import BOOTSTRAP, COUPONS, DB, MIGRATION, TIMEOUT, Database, Topics, wait_until


@pytest.fixture
def db() -> Iterator[Database]:
    name = f"inbox_python_{uuid.uuid4().hex[:12]}"
    admin = pymysql.connect(**DB, autocommit=True)
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    database = Database(name, functools.partial(pymysql.connect, **DB, database=name))
    conn = database.connect(autocommit=True)
    with conn.cursor() as cur:
        for statement in MIGRATION.read_text().split(";"):
            if "CREATE TABLE" in statement:
                cur.execute(statement)
        cur.execute(COUPONS)
    conn.close()
    try:
        yield database
    finally:
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.close()


@pytest.fixture
def topics() -> Iterator[Topics]:
    base = f"inbox-python-{uuid.uuid4().hex[:12]}"
    t = Topics(base, base + "-dlq")
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    futures = admin.create_topics([NewTopic(t.topic, 2, 1), NewTopic(t.dlq, 1, 1)])
    for future in futures.values():
        future.result(TIMEOUT)
    wait_until(
        lambda: all(name in admin.list_topics(timeout=10).topics for name in (t.topic, t.dlq)),
        "topics in metadata",
    )
    try:
        yield t
    finally:
        for future in admin.delete_topics([t.topic, t.dlq]).values():
            with contextlib.suppress(Exception):
                future.result(TIMEOUT)
