"""Fixtures: a fresh database and fresh topics per test (see support.py for the settings)."""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import Iterator

import pymysql
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from support import (
    BOOTSTRAP,
    COUPONS,
    DB,
    MYSQL_DB,
    TIMEOUT,
    Database,
    Topics,
    create_table_statements,
    wait_until,
)


@pytest.fixture
def db() -> Iterator[Database]:
    name = f"inbox_python_{uuid.uuid4().hex[:12]}"
    database = Database(name, functools.partial(pymysql.connect, **DB, database=name))
    server = Database("", functools.partial(pymysql.connect, **DB))
    server.query(f"CREATE DATABASE {name}")
    try:
        for statement in create_table_statements():
            database.query(statement)
        database.query(COUPONS)
        yield database
    finally:
        server.query(f"DROP DATABASE IF EXISTS {name}")


def _server_database(server: str) -> Iterator[Database]:
    settings = DB if server == "mariadb" else MYSQL_DB
    try:
        pymysql.connect(**settings).close()
    except pymysql.err.MySQLError as error:
        env = "INBOX_TEST_DB_PORT" if server == "mariadb" else "INBOX_TEST_MYSQL_PORT"
        pytest.fail(
            f"cannot connect to the {server} test server at {settings['host']}:{settings['port']}"
            f" (set {env}): {error}"
        )
    name = f"inbox_python_{uuid.uuid4().hex[:12]}"
    database = Database(name, functools.partial(pymysql.connect, **settings, database=name), server)
    admin = Database("", functools.partial(pymysql.connect, **settings), server)
    admin.query(f"CREATE DATABASE {name}")
    try:
        for statement in create_table_statements():
            database.query(statement)
        database.query(COUPONS)
        yield database
    finally:
        admin.query(f"DROP DATABASE IF EXISTS {name}")


@pytest.fixture(params=["mariadb", "mysql"])
def any_db(request) -> Iterator[Database]:
    """A fresh database on MariaDB, then on MySQL 8.0 (batch mode's statements differ)."""
    yield from _server_database(request.param)


@pytest.fixture
def mysql_db() -> Iterator[Database]:
    """A fresh database on MySQL 8.0 (INBOX_TEST_MYSQL_PORT)."""
    yield from _server_database("mysql")


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
