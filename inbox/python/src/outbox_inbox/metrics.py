"""The inbox's Prometheus metrics (inbox/CONTRACT.md, "Metrics"), through ``prometheus_client``.

Opt-in: ``InboxSettings(metrics_registry=CollectorRegistry())``. The collectors are created once
per registry and shared by every inbox and runner using it (each labels its series with its
consumer name), so two inboxes on one registry do not collide, and inboxes on different
registries (e.g. tests in one process) do not see each other.
"""

from __future__ import annotations

import contextlib
import threading
import weakref

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["InboxMetrics"]

_lock = threading.Lock()
_collectors: weakref.WeakKeyDictionary[CollectorRegistry, tuple[Counter, Gauge, Gauge, Gauge]] = (
    weakref.WeakKeyDictionary()
)


def _collectors_of(registry: CollectorRegistry) -> tuple[Counter, Gauge, Gauge, Gauge]:
    with _lock:
        found = _collectors.get(registry)
        if found is None:
            found = (
                Counter(
                    "outbox_inbox_records",
                    "Records settled by the inbox, by original topic and outcome.",
                    ["consumer", "topic", "outcome"],
                    registry=registry,
                ),
                Gauge(
                    "outbox_inbox_parked_records",
                    "Parked rows of the consumer at the last sweep.",
                    ["consumer"],
                    registry=registry,
                ),
                Gauge(
                    "outbox_inbox_parked_oldest_seconds",
                    "Age of the oldest parked row at the last sweep (0: none).",
                    ["consumer"],
                    registry=registry,
                ),
                Gauge(
                    "outbox_inbox_consumer_lag",
                    "The partition's high watermark minus the consumer's position, after a poll.",
                    ["consumer", "topic", "partition"],
                    registry=registry,
                ),
            )
            _collectors[registry] = found
        return found


class InboxMetrics:
    """The series of one consumer in one registry."""

    def __init__(self, registry: CollectorRegistry, consumer: str) -> None:
        self.consumer = consumer
        # The parked gauges appear with the first sweep (a consumer that never parks has none).
        self._records, self._parked, self._oldest, self._lag = _collectors_of(registry)

    def settled(self, topic: str, outcome: str) -> None:
        """Count one settled record (``topic``: its original topic)."""
        self._records.labels(self.consumer, topic, outcome).inc()

    def parked(self, count: int, oldest_seconds: float | None) -> None:
        """The parked rows found by a sweep, and the age of the oldest (``None``: none)."""
        self._parked.labels(self.consumer).set(count)
        self._oldest.labels(self.consumer).set(oldest_seconds or 0.0)

    def lag(self, topic: str, partition: int, lag: int) -> None:
        self._lag.labels(self.consumer, topic, str(partition)).set(lag)

    def forget_partition(self, topic: str, partition: int) -> None:
        """Drop the lag series of a partition no longer assigned."""
        with contextlib.suppress(KeyError):
            self._lag.remove(self.consumer, topic, str(partition))
