"""The consumer span continues the record's W3C trace (inbox/CONTRACT.md, "Trace context"),
against the real database and Kafka, with the OpenTelemetry SDK's in-memory exporter."""

from __future__ import annotations

import threading
import uuid

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from support import BOOTSTRAP, TIMEOUT, Database, Topics, headers_of, record, wait_until

from outbox_inbox import Inbox, InboxRunner, InboxSettings, Outcome, dead_letter_producer

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


@pytest.fixture
def tracing() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def traced(rec: dict, *extra: tuple[str, bytes]) -> dict:
    """``rec`` (a :func:`support.record`) with extra headers."""
    rec["headers"] = [*rec["headers"], *extra]
    return rec


class TracedHandler:
    """Inserts a coupon row and starts a span ``handler`` in the current context (as an
    application's own instrumentation would); raises ``fail`` when set."""

    def __init__(self, provider: TracerProvider, fail: Exception | None = None) -> None:
        self.tracer = provider.get_tracer("app")
        self.fail = fail

    def __call__(self, tx, rec) -> None:
        with self.tracer.start_as_current_span("handler"), tx.cursor() as cur:
            cur.execute(
                "INSERT INTO coupons (consumer, order_id, event_key) VALUES (%s, %s, %s)",
                ("c1", rec.key().decode(), headers_of(rec).get("event_key")),
            )
        if self.fail is not None:
            raise self.fail


def make_inbox(db: Database, topics: Topics, provider: TracerProvider, **overrides) -> Inbox:
    settings = InboxSettings(
        consumer="c1",
        dead_letter_topic=topics.dlq,
        backoff_initial=0.01,
        backoff_max=0.05,
        **overrides,
    )
    producer = dead_letter_producer({"bootstrap.servers": BOOTSTRAP})
    return Inbox(settings, db.connect, producer, tracer_provider=provider)


def named(exporter: InMemorySpanExporter, name: str):
    spans = [s for s in exporter.get_finished_spans() if s.name == name]
    assert len(spans) == 1, [s.name for s in exporter.get_finished_spans()]
    return spans[0]


def test_span_continues_the_records_trace(db, topics, tracing) -> None:
    provider, exporter = tracing
    topics.produce(
        [
            traced(
                record("e-1", key="order-1"),
                ("traceparent", TRACEPARENT.encode()),
                ("tracestate", b"vendor=abc"),
            )
        ]
    )
    (rec,) = topics.read(1)
    inbox = make_inbox(db, topics, provider)

    assert inbox.process(rec, TracedHandler(provider)).outcome is Outcome.PROCESSED

    assert db.query("SELECT event_key FROM coupons") == [("e-1",)]
    span = named(exporter, f"{topics.topic} process")
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert span.parent is not None and span.parent.is_remote
    assert format(span.parent.span_id, "016x") == PARENT_ID
    assert span.parent.trace_state.get("vendor") == "abc"
    assert span.kind is SpanKind.CONSUMER
    assert span.status.status_code is StatusCode.UNSET
    assert dict(span.attributes) == {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.destination.name": topics.topic,
        "messaging.destination.partition.id": "0",
        "messaging.kafka.destination.partition": 0,
        "messaging.kafka.offset": 0,
        "messaging.kafka.message.key": "order-1",
        "messaging.consumer.group.name": "c1",
        "inbox.consumer": "c1",
        "inbox.event_key": "e-1",
        "inbox.outcome": "processed",
        "inbox.attempts": 1,
    }
    handler = named(exporter, "handler")
    assert handler.context.trace_id == span.context.trace_id
    assert handler.parent.span_id == span.context.span_id

    # The redelivery: a span in the same trace, outcome duplicate, no handler span.
    exporter.clear()
    assert inbox.process(rec, TracedHandler(provider)).outcome is Outcome.DUPLICATE
    (dup,) = exporter.get_finished_spans()
    assert format(dup.context.trace_id, "032x") == TRACE_ID
    assert dup.attributes["inbox.outcome"] == "duplicate"
    assert dup.status.status_code is StatusCode.UNSET
    inbox.close()


def test_span_of_a_failing_handler_is_an_error(db, topics, tracing) -> None:
    provider, exporter = tracing
    topics.produce([traced(record("e-p", key="order-p"), ("traceparent", TRACEPARENT.encode()))])
    (rec,) = topics.read(1)
    inbox = make_inbox(db, topics, provider, max_attempts=3)

    result = inbox.process(rec, TracedHandler(provider, RuntimeError("poison record")))

    assert (result.outcome, result.attempts) == (Outcome.DEAD_LETTERED, 3)
    (dead,) = topics.read(1, topics.dlq)
    assert headers_of(dead)["dlq_reason"] == "poison record"
    span = named(exporter, f"{topics.topic} process")
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert format(span.parent.span_id, "016x") == PARENT_ID
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "poison record"
    assert span.attributes["inbox.outcome"] == "dead_lettered"
    assert span.attributes["inbox.attempts"] == 3
    exceptions = [e for e in span.events if e.name == "exception"]
    assert [e.attributes["inbox.attempt"] for e in exceptions] == [1, 2, 3]
    assert exceptions[0].attributes["exception.message"] == "poison record"
    inbox.close()


def test_span_of_a_record_without_traceparent_is_a_root(db, topics, tracing) -> None:
    provider, exporter = tracing
    topics.produce([record("e-1"), record(None, key="order-x")])
    rec, no_key = topics.read(2)
    inbox = make_inbox(db, topics, provider)

    assert inbox.process(rec, TracedHandler(provider)).outcome is Outcome.PROCESSED

    span = named(exporter, f"{topics.topic} process")
    assert span.parent is None
    assert span.context.trace_id != int(TRACE_ID, 16)
    assert named(exporter, "handler").parent.span_id == span.context.span_id

    # A record without event_key is dead-lettered inside its span: status error.
    exporter.clear()
    assert inbox.process(no_key, TracedHandler(provider)).outcome is Outcome.DEAD_LETTERED
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["inbox.outcome"] == "dead_lettered"
    assert "inbox.event_key" not in span.attributes
    inbox.close()


def test_without_an_sdk_the_span_is_a_noop(db, topics) -> None:
    topics.produce([traced(record("e-1"), ("traceparent", TRACEPARENT.encode()))])
    (rec,) = topics.read(1)
    settings = InboxSettings(consumer="c1", dead_letter_topic=topics.dlq)
    inbox = Inbox(settings, db.connect, dead_letter_producer({"bootstrap.servers": BOOTSTRAP}))
    seen = []

    def handler(tx, _rec) -> None:
        seen.append(trace.get_current_span().get_span_context())

    assert inbox.process(rec, handler).outcome is Outcome.PROCESSED
    # The API's no-op span still carries the record's context (so it propagates further).
    assert format(seen[0].trace_id, "032x") == TRACE_ID
    inbox.close()


def test_runner_span_has_the_group_and_the_records_trace(db, topics, tracing) -> None:
    provider, exporter = tracing
    topics.produce([traced(record("e-1"), ("traceparent", TRACEPARENT.encode()))])
    inbox = make_inbox(db, topics, provider)
    group = f"inbox-python-g-{uuid.uuid4().hex[:8]}"
    config = {"bootstrap.servers": BOOTSTRAP, "group.id": group, "auto.offset.reset": "earliest"}
    runner = InboxRunner(
        inbox,
        TracedHandler(provider),
        config,
        [topics.topic],
        on_settled=lambda _rec, _res, _at: runner.stop(),
    )
    guard = threading.Timer(TIMEOUT, runner.stop)  # never hang the suite
    guard.start()
    try:
        runner.run()
    finally:
        guard.cancel()
        inbox.close()
    wait_until(lambda: db.query("SELECT COUNT(*) FROM coupons") == [(1,)], "the coupon")
    span = named(exporter, f"{topics.topic} process")
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert format(span.parent.span_id, "016x") == PARENT_ID
    assert span.attributes["messaging.consumer.group.name"] == group
    assert span.attributes["inbox.outcome"] == "processed"
