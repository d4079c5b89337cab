"""The dead-letter topic exists before the first dead letter needs it (inbox/CONTRACT.md)."""

from __future__ import annotations

import time

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

__all__ = ["DeadLetterTopicError", "ensure_topic"]

# librdkafka properties only a consumer takes: left out of the admin client's configuration.
_CONSUMER_ONLY = {
    "group.id",
    "group.instance.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "auto.offset.reset",
    "session.timeout.ms",
    "max.poll.interval.ms",
    "isolation.level",
    "auto.commit.interval.ms",
    "partition.assignment.strategy",
    "enable.partition.eof",
}


class DeadLetterTopicError(RuntimeError):
    """The dead-letter topic (or a retry tier topic) is missing and the broker refused to create
    it (or was not reachable); the message names the topic and the fix."""


def ensure_topic(
    config: dict,
    topic: str,
    timeout: float = 30.0,
    *,
    role: str = "dead-letter topic",
    fix: str = "set dead_letter_topic to an existing topic",
) -> None:
    """Make sure ``topic`` exists: read its metadata and, when the broker does not know it,
    create it with the broker's defaults (partitions, replication) through the admin
    CreateTopics request; a topic another client created meanwhile counts as there. Returns
    once the broker's metadata serves the topic, so a consumer subscribing next finds it.
    ``config``: librdkafka properties (``bootstrap.servers`` at least; consumer-only ones are
    ignored). Raises :class:`DeadLetterTopicError` naming the topic and the fix when the broker
    refuses (an invalid name, a creation policy, no CREATE permission) or cannot be asked.
    ``role`` and ``fix`` word the error (the runner also ensures the retry tier topics)."""
    admin = AdminClient({k: v for k, v in config.items() if k not in _CONSUMER_ONLY})
    try:
        metadata = admin.list_topics(topic=topic, timeout=timeout)
        known = metadata.topics.get(topic)
        if known is not None and known.error is None:
            return
        if known is not None and known.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
            raise KafkaException(known.error)
        future = admin.create_topics([NewTopic(topic)], request_timeout=timeout)[topic]
        try:
            future.result(timeout)
        except KafkaException as error:
            if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
        _wait_until_served(admin, topic, timeout)
    except KafkaException as error:
        raise DeadLetterTopicError(
            f"{role} {topic!r} does not exist and the broker refused to create it: "
            f"{error}; create it (kafka-topics.sh --create --topic {topic}), grant this client "
            f"CREATE on it, or {fix} (a valid name: at most 249 of [a-zA-Z0-9._-])"
        ) from error


def _wait_until_served(admin: AdminClient, topic: str, timeout: float) -> None:
    """Wait until the broker's metadata serves ``topic`` with its partitions.

    CreateTopics answers once the controller created the topic, and the brokers learn of it a
    moment later. A consumer that subscribes meanwhile is told the topic does not exist, and
    librdkafka asks again only at ``topic.metadata.refresh.interval.ms`` (5 minutes by default),
    so records in a just-created retry tier would wait that long. Raises ``KafkaException``
    when the topic is still not served after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        known = admin.list_topics(topic=topic, timeout=max(remaining, 0.1)).topics.get(topic)
        if known is not None and known.error is None and known.partitions:
            return
        if remaining <= 0:
            raise KafkaException(
                KafkaError(
                    KafkaError.UNKNOWN_TOPIC_OR_PART,
                    f"created, but the broker did not serve it within {timeout} s",
                )
            )
        time.sleep(min(0.05, remaining))
