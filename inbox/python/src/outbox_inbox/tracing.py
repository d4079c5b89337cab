"""The consumer span of each record (inbox/CONTRACT.md, "Trace context").

The record's W3C ``traceparent``/``tracestate`` headers are extracted with an OpenTelemetry
propagator and the record is processed inside a span ``"<topic> process"`` of kind CONSUMER whose
parent is that remote context. Only the OpenTelemetry API is used: without an SDK installed by the
application every span is a no-op.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from confluent_kafka import Message
from opentelemetry.propagators.textmap import Getter

__all__ = ["HeadersGetter", "span_attributes"]

INSTRUMENTATION_NAME = "outbox_inbox"

Headers = Sequence[tuple[str, bytes | None]]


class HeadersGetter(Getter[Headers]):
    """Reads a confluent-kafka record's headers (a list of ``(name, bytes)``) for a propagator.

    Names are compared exactly (the relay writes them in lower case); of repeated headers the last
    wins, as for the inbox's own headers. Values are decoded as UTF-8 (invalid bytes replaced).
    """

    def get(self, carrier: Headers, key: str) -> list[str] | None:
        """The value of the last header called ``key`` as a one-item list, or ``None``."""
        value = None
        for name, raw in carrier:
            if name == key:
                value = raw
        if value is None:
            return None
        return [value.decode("utf-8", errors="replace")]

    def keys(self, carrier: Headers) -> list[str]:
        """The header names."""
        return [name for name, _ in carrier]


HEADERS_GETTER = HeadersGetter()


def span_attributes(
    record: Message, consumer: str, group: str, event_key: str | None
) -> dict[str, str | int]:
    """The attributes of a record's consumer span known before processing (messaging semantic
    conventions, plus ``inbox.consumer`` and ``inbox.event_key``)."""
    attributes: dict[str, str | int] = {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.destination.name": record.topic() or "",
        "messaging.destination.partition.id": str(record.partition()),
        "messaging.kafka.destination.partition": record.partition() or 0,
        "messaging.kafka.offset": record.offset() or 0,
        "messaging.consumer.group.name": group,
        "inbox.consumer": consumer,
    }
    key = record.key()
    if key:
        with contextlib.suppress(UnicodeDecodeError):  # a binary key is left out
            attributes["messaging.kafka.message.key"] = (
                key.decode("utf-8") if isinstance(key, bytes) else str(key)
            )
    if event_key:
        attributes["inbox.event_key"] = event_key
    return attributes
