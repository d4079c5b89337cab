"""Settings of an inbox consumer (inbox/CONTRACT.md, "Settings")."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Message

MAX_BATCH_RECORDS = 10000
"""The largest allowed ``InboxSettings.batch_max_records``."""

__all__ = [
    "MAX_BATCH_RECORDS",
    "EffectiveSettings",
    "GapPolicy",
    "InboxSettings",
    "TopicSettings",
    "backoff_delay",
]


class GapPolicy(str, enum.Enum):
    """What to do with a record whose version is more than one past the stored version."""

    PARK = "park"
    """Store it in the parked table (outcome ``parked``) and apply it by itself once the version
    before it has been (outcome ``resumed``); past ``gap_deadline`` it is dead-lettered."""
    DEAD_LETTER = "dead_letter"
    """Dead-letter the record at once (outcome ``dead_lettered``)."""
    RETRY = "retry"
    """Count it as a failed attempt; dead-letter it after ``max_attempts``."""


@dataclass(frozen=True)
class TopicSettings:
    """What one topic overrides of the consumer-wide settings (inbox/CONTRACT.md, "Per-topic
    settings"): every field ``None`` (the default) inherits the :class:`InboxSettings` value.
    ``retry_tiers=[]`` means no tiers for that topic (blocking retries only) even when the
    consumer-wide ``retry_tiers`` has some. Durations in seconds. Validated by
    :class:`InboxSettings` (errors name the topic and the field)."""

    max_attempts: int | None = None
    backoff_initial: float | None = None
    backoff_max: float | None = None
    retry_tiers: list[float] | None = None
    gap_policy: GapPolicy | str | None = None
    gap_deadline: float | None = None
    inbox_retention: float | None = None


@dataclass(frozen=True)
class EffectiveSettings:
    """The settings that apply to the records of one topic (:meth:`InboxSettings.for_topic`):
    the topic's overrides over the consumer-wide values."""

    max_attempts: int
    backoff_initial: float
    backoff_max: float
    retry_tiers: tuple[float, ...]
    gap_policy: GapPolicy
    gap_deadline: float
    inbox_retention: float


_OVERRIDABLE = (
    "max_attempts",
    "backoff_initial",
    "backoff_max",
    "retry_tiers",
    "gap_policy",
    "gap_deadline",
    "inbox_retention",
)


def _effective(where: str, values: dict[str, Any]) -> EffectiveSettings:
    """Validate the effective ``values`` (``where`` prefixes the field in errors)."""

    def fail(name: str, rule: str) -> ValueError:
        return ValueError(f"{where}{name} {rule} (got {values[name]!r})")

    attempts = values["max_attempts"]
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise fail("max_attempts", "must be an integer of at least 1")
    for name in ("backoff_initial", "backoff_max", "gap_deadline"):
        if values[name] < 0:
            raise fail(name, "must not be negative")
    if values["backoff_initial"] > values["backoff_max"]:
        raise ValueError(
            f"{where}backoff_initial ({values['backoff_initial']!r}) must not exceed "
            f"{where}backoff_max ({values['backoff_max']!r})"
        )
    if values["inbox_retention"] <= 0:
        raise fail("inbox_retention", "must be positive")
    if any(d < 0 for d in values["retry_tiers"]):
        raise fail("retry_tiers", "must not hold a negative delay")
    try:
        policy = GapPolicy(values["gap_policy"])
    except ValueError:
        raise fail("gap_policy", "must be one of park, dead_letter, retry") from None
    return EffectiveSettings(
        max_attempts=attempts,
        backoff_initial=float(values["backoff_initial"]),
        backoff_max=float(values["backoff_max"]),
        retry_tiers=tuple(float(d) for d in values["retry_tiers"]),
        gap_policy=policy,
        gap_deadline=float(values["gap_deadline"]),
        inbox_retention=float(values["inbox_retention"]),
    )


@dataclass(frozen=True)
class InboxSettings:
    """How an :class:`~outbox_inbox.Inbox` processes records.

    ``consumer`` and ``dead_letter_topic`` are required; everything else has the contract's
    default. Durations are in seconds (floats). Raises :class:`ValueError` on construction when
    a value is out of range.
    """

    consumer: str
    """The consumer's name: part of the inbox key, and the default Kafka group id."""
    dead_letter_topic: str
    """Topic that receives dead letters (required: there is no default)."""
    inbox_table: str = "outbox_inbox"
    """Table of processed ``(consumer, event_key)`` rows (``migrations/0004_inbox.sql``)."""
    version_table: str = "outbox_inbox_version"
    """Table of the last applied version per ``(consumer, aggregate_type, aggregate_id)``."""
    parked_table: str = "outbox_inbox_parked"
    """Table of parked records (``migrations/0006_inbox_parked.sql``)."""
    event_key_header: str = "event_key"
    """Header holding the event's unique key (UTF-8 text)."""
    version_header: str | None = None
    """Header holding the aggregate version (decimal integer text); ``None``: no version check."""
    version_fn: Callable[[Message], int | None] | None = None
    """Alternative to ``version_header``: gives the record's version (``None``: no check for this
    record). A raised exception makes the record a poison record (dead-lettered at once)."""
    aggregate_type_header: str = "aggregate_type"
    """Header holding the aggregate type for the version check (the key is the aggregate id)."""
    gap_policy: GapPolicy = GapPolicy.PARK
    """Policy for version gaps (see :class:`GapPolicy`)."""
    max_attempts: int = 5
    """Attempts per record before it is dead-lettered (at least 1)."""
    backoff_initial: float = 0.1
    """Wait before the 2nd attempt, in seconds; doubles per attempt."""
    backoff_max: float = 10.0
    """Upper bound of the wait between attempts, in seconds."""
    gap_deadline: float = 3600.0
    """How long, in seconds, a parked record may wait for the version before it; then the sweep
    dead-letters it."""
    park_sweep_interval: float = 10.0
    """How often, in seconds, :class:`~outbox_inbox.InboxRunner` sweeps the parked table (and
    once before the first poll): resumes rows whose predecessor was applied, drops stale ones,
    dead-letters expired ones."""
    outage_budget: float = 300.0
    """How long, in seconds, one record may keep failing with infrastructure errors only (the
    database unreachable, a lost connection, a read-only server, a deadlock...: see
    :func:`~outbox_inbox.is_infrastructure_error`) before :meth:`~outbox_inbox.Inbox.process`
    raises :class:`~outbox_inbox.OutageError`, the record unsettled. Those errors are retried
    with the backoff above and do not count toward ``max_attempts``."""
    retry_tiers: list[float] = field(default_factory=list)
    """Delays, in seconds, of the retry tiers (inbox/CONTRACT.md, "Retry tiers"): a record whose
    ``max_attempts`` are used up by handler or data errors is not dead-lettered but copied to
    the next tier's topic (outcome ``retried``) and processed again from there once the tier's
    delay has passed; after the last tier it is dead-lettered. Per-key order is broken while a
    record waits in a tier. Empty (the default): blocking retries only. A topic may have its own
    (``topics``)."""
    retry_topic_format: str = "{topic}.retry.{n}"
    """Names the topic of tier ``n`` (1-based) of topic ``T``: ``{topic}`` is replaced by ``T``
    and ``{n}`` by ``n``."""
    inbox_retention: float = 7 * 24 * 3600.0
    """How long, in seconds, inbox rows are kept (7 days): read by ``outbox-relay prune --inbox``
    (give it the same windows), not by the inbox itself. Keep it longer than the longest
    redelivery."""
    topics: dict[str, TopicSettings] = field(default_factory=dict)
    """Per-topic overrides of ``max_attempts``, ``backoff_initial``, ``backoff_max``,
    ``retry_tiers``, ``gap_policy``, ``gap_deadline`` and ``inbox_retention`` (see
    :class:`TopicSettings` and :meth:`for_topic`), by topic name: a record's topic is its
    ``original_topic`` header when it has one (a retry copy), else its own."""
    batch_max_records: int = 1
    """Batch mode (inbox/CONTRACT.md, "Batch mode"): at most this many records of one poll are
    settled in one database transaction by :meth:`~outbox_inbox.Inbox.process_batch` (the
    :class:`~outbox_inbox.InboxRunner` polls up to this many at once). ``1`` (the default): off,
    one transaction per record. Consumer-wide. Allowed: 1 to 10000."""
    batch_max_wait: float = 0.02
    """Batch mode: how long, in seconds (default 0.02: 20 ms), the runner waits for more records
    once a poll returned at least one, before processing the batch. Not negative."""
    metrics_registry: Any = None
    """A ``prometheus_client.CollectorRegistry`` the inbox (and its runner) registers its metrics
    in (inbox/CONTRACT.md, "Metrics"); ``None`` (the default): no metrics. Never the global
    ``REGISTRY`` implicitly: pass ``prometheus_client.REGISTRY`` to expose them there."""

    def __post_init__(self) -> None:
        if not self.consumer:
            raise ValueError("consumer is required")
        if not self.dead_letter_topic:
            raise ValueError("dead_letter_topic is required")
        if not self.event_key_header:
            raise ValueError("event_key_header must not be empty")
        if self.park_sweep_interval <= 0:
            raise ValueError("park_sweep_interval must be positive")
        if self.outage_budget < 0:
            raise ValueError("outage_budget must not be negative")
        records = self.batch_max_records
        if (
            isinstance(records, bool)
            or not isinstance(records, int)
            or not 1 <= records <= MAX_BATCH_RECORDS
        ):
            raise ValueError(
                f"batch_max_records must be an integer from 1 to {MAX_BATCH_RECORDS}"
                f" (got {records!r})"
            )
        if self.batch_max_wait < 0:
            raise ValueError(f"batch_max_wait must not be negative (got {self.batch_max_wait!r})")
        defaults = {name: getattr(self, name) for name in _OVERRIDABLE}
        default = _effective("", defaults)
        # Accept the plain strings "park"/"dead_letter"/"retry" too.
        object.__setattr__(self, "gap_policy", default.gap_policy)
        object.__setattr__(self, "retry_tiers", list(default.retry_tiers))
        resolved: dict[str, EffectiveSettings] = {}
        for topic, overrides in self.topics.items():
            if not isinstance(topic, str) or not topic:
                raise ValueError(f"topics: {topic!r} is not a topic name")
            if not isinstance(overrides, TopicSettings):
                raise TypeError(f"topics[{topic!r}] must be a TopicSettings")
            values = dict(defaults)
            for name in _OVERRIDABLE:
                value = getattr(overrides, name)
                if value is not None:
                    values[name] = value
            resolved[topic] = _effective(f"topics[{topic!r}].", values)
        tiers = any(e.retry_tiers for e in (default, *resolved.values()))
        if tiers and "{n}" not in self.retry_topic_format:
            raise ValueError(f"retry_topic_format {self.retry_topic_format!r} lacks {{n}}")
        object.__setattr__(self, "_default", default)
        object.__setattr__(self, "_resolved", resolved)

    def for_topic(self, topic: str) -> EffectiveSettings:
        """The settings that apply to the records of ``topic`` (for a retry copy: its
        ``original_topic``): its :class:`TopicSettings` over the consumer-wide values. The one
        place the inbox and the runner read ``max_attempts``, ``backoff_initial``,
        ``backoff_max``, ``retry_tiers``, ``gap_policy``, ``gap_deadline`` and
        ``inbox_retention``."""
        return self._resolved.get(topic, self._default)  # type: ignore[attr-defined]

    @property
    def all_effective(self) -> list[EffectiveSettings]:
        """The consumer-wide settings and those of every configured topic."""
        return [self._default, *self._resolved.values()]  # type: ignore[attr-defined]

    @property
    def checks_versions(self) -> bool:
        """Whether records are checked against the version table."""
        return self.version_fn is not None or bool(self.version_header)

    def retry_tiers_of(self, topic: str) -> list[float]:
        """The retry tiers of ``topic`` (the original topic of a copy): ``for_topic(topic)``."""
        return list(self.for_topic(topic).retry_tiers)

    def retry_topic(self, topic: str, n: int) -> str:
        """The topic of tier ``n`` (1-based) of ``topic``."""
        return self.retry_topic_format.replace("{topic}", topic).replace("{n}", str(n))

    def retry_topics(self, topic: str) -> list[str]:
        """The tier topics of ``topic``, tier 1 first (none without tiers)."""
        return [self.retry_topic(topic, n) for n in range(1, len(self.retry_tiers_of(topic)) + 1)]


def backoff_delay(attempt: int, initial: float, maximum: float) -> float:
    """Seconds to wait after failed attempt ``attempt`` (1-based): ``initial * 2**(attempt-1)``,
    capped at ``maximum``."""
    if attempt < 1:
        return 0.0
    # Cap the exponent so the float never overflows on absurd attempt counts.
    return min(initial * (2.0 ** min(attempt - 1, 62)), maximum)
