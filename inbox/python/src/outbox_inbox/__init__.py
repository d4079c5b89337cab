"""outbox_inbox: the consumer side of outbox-relay (inbox/CONTRACT.md).

Records every processed ``(consumer, event_key)`` in the same MySQL/MariaDB transaction as the
business change, so a redelivered record is acknowledged without running its handler again.

- :class:`Inbox` settles one record (:meth:`Inbox.process`), or a batch of records in one
  transaction (:meth:`Inbox.process_batch`, batch mode), for users with their own poll loop;
- :class:`InboxRunner` owns a confluent-kafka consumer loop around an :class:`Inbox`.
"""

from .inbox import (
    DeadLetterError,
    Handler,
    Hooks,
    Inbox,
    OutageError,
    Outcome,
    ProcessResult,
    dead_letter_producer,
    is_infrastructure_error,
    origin,
    retry_at,
    retry_tier,
)
from .runner import InboxRunner, Processor
from .settings import EffectiveSettings, GapPolicy, InboxSettings, TopicSettings, backoff_delay
from .topics import DeadLetterTopicError, ensure_topic

__all__ = [
    "DeadLetterError",
    "DeadLetterTopicError",
    "EffectiveSettings",
    "GapPolicy",
    "Handler",
    "Hooks",
    "Inbox",
    "InboxRunner",
    "InboxSettings",
    "OutageError",
    "Outcome",
    "ProcessResult",
    "Processor",
    "TopicSettings",
    "backoff_delay",
    "dead_letter_producer",
    "ensure_topic",
    "is_infrastructure_error",
    "origin",
    "retry_at",
    "retry_tier",
]
