"""Kafka administration for the stack and its callers: the event topic's and the writer registry's
configs, topic creation and deletion, partition offsets, and which broker errors are worth retrying.

Topics are always created explicitly with their configs (the brokers refuse to create one on first
use). ``confluent_kafka`` is imported only when a call needs it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from infra.cli import Unreachable
from infra.clients import kafka_admin, kafka_consumer
from infra.processes import StackError
from infra.settings import Settings

# The retained event log: the source of truth, so nothing may ever be deleted by time or size.
EVENTS_TOPIC_CONFIGS: dict[str, str] = {
    "retention.ms": "-1",
    "retention.bytes": "-1",
    "cleanup.policy": "delete",  # never compacted: every event, not the latest per key
    "min.insync.replicas": "1",  # one local broker; 2 with replication 3 when scaled
    "unclean.leader.election.enable": "false",  # never lose acknowledged events on failover
    # The broker stamps each record when it is appended: per partition monotonic, independent of
    # producer clocks, so offsets-for-times lookups (replay from a time) are exact. Device and
    # server times live in the event itself (docs/events.md).
    "message.timestamp.type": "LogAppendTime",
    "compression.type": "producer",
}


def events_topic_configs(settings: Settings) -> dict[str, str]:
    """The event topic's configs for this profile: in the cluster profile an acks=all write is on
    two of its three replicas before it is acknowledged (`min.insync.replicas=2`)."""
    return {**EVENTS_TOPIC_CONFIGS, "min.insync.replicas": str(settings.min_insync_replicas)}


def writers_topic(settings: Settings, events_topic: str | None = None) -> str:
    """The registry of snowflake worker ids of the log (contract/writers.py) for the log ``events_topic`` (default: the settings' event topic)."""
    return settings.writers_topic or f"{events_topic or settings.events_topic}.writers"


def writers_topic_configs(settings: Settings) -> dict[str, str]:
    """Compacted and kept forever: claims have unique keys, so the cleaner never removes one."""
    return {
        "cleanup.policy": "compact",
        "retention.ms": "-1",
        "retention.bytes": "-1",
        "min.insync.replicas": str(settings.min_insync_replicas),
        "unclean.leader.election.enable": "false",
    }


def ensure_writers_topic(settings: Settings, events_topic: str | None = None, timeout_s: float = 30.0) -> str:
    """Create the registry topic if it is missing (idempotent); returns its name."""
    name = writers_topic(settings, events_topic)
    create_topic(
        settings,
        name,
        1,
        writers_topic_configs(settings),
        replication_factor=settings.replication_factor,
        timeout_s=timeout_s,
    )
    return name


_quiet = logging.getLogger("infra.stack.librdkafka")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False


def admin_client(settings: Settings):
    # librdkafka logs every refused connection while the broker starts; keep that out of the terminal
    return kafka_admin(settings, {"logger": _quiet})


def require_kafka(settings: Settings, timeout_s: float = 5.0) -> None:
    """Raise :class:`~infra.cli.Unreachable` unless a broker answers a metadata request in time
    (a command checks before its slow start: a JVM, a Spark session)."""
    from confluent_kafka import KafkaException

    try:
        admin_client(settings).list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise Unreachable("Kafka", f"{settings.kafka_bootstrap}: {exc.args[0].str()}") from None


def create_topic(
    settings: Settings,
    name: str,
    partitions: int,
    configs: Mapping[str, str] | None = None,
    replication_factor: int = 1,
    timeout_s: float = 30.0,
) -> bool:
    """Create a topic with explicit configs; True if created, False if it already existed."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    topic = NewTopic(
        name, num_partitions=partitions, replication_factor=replication_factor, config=dict(configs or {})
    )
    admin = admin_client(settings)  # must outlive the future, or librdkafka cancels the request
    future = admin.create_topics([topic], operation_timeout=timeout_s)[name]
    try:
        future.result(timeout=timeout_s)
    except TimeoutError:
        raise Unreachable(
            "Kafka", f"{settings.kafka_bootstrap}: creating topic {name!r} got no answer in {timeout_s:g} s"
        ) from None
    except KafkaException as exc:
        if exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        raise StackError(f"creating topic {name!r} failed: {exc.args[0].str()}") from None
    return True


def kafka_retriable(exc: BaseException) -> bool:
    """A broker error worth asking again. librdkafka marks most, but not those a leader change
    answers, which Kafka's protocol calls retriable: OFFSET_NOT_AVAILABLE (a new leader until its
    high watermark caught up after an election; a fault test met it right after killing a leader),
    NOT_LEADER_FOR_PARTITION and LEADER_NOT_AVAILABLE (a just-restarted broker taking its
    partitions back: a writer's registry lookup met it as an error of get_watermark_offsets, which
    librdkafka does not mark retriable)."""
    from confluent_kafka import KafkaError, KafkaException

    if not isinstance(exc, KafkaException):
        return False
    err = exc.args[0]
    return err.retriable() or err.code() in (
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
    )


def end_offsets(settings: Settings, topic: str, timeout_s: float = 10.0) -> dict[int, int]:
    """The current end (high watermark) of every partition of ``topic``.

    Retriable broker errors are retried for up to ``timeout_s``: a broker that has just
    restarted answers "not leader for partition" until its partitions have leaders again.
    """
    return {p: high for p, (_low, high) in watermarks(settings, topic, timeout_s).items()}


def watermarks(settings: Settings, topic: str, timeout_s: float = 10.0) -> dict[int, tuple[int, int]]:
    """``(first retained offset, end)`` of every partition of ``topic`` (retried as :func:`end_offsets`)."""
    from confluent_kafka import KafkaException, TopicPartition
    from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

    consumer = kafka_consumer(settings, "end-offsets")

    def lookup() -> dict[int, tuple[int, int]]:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
        if meta.error is not None:
            error = KafkaException(meta.error)
            if kafka_retriable(error):  # e.g. LEADER_NOT_AVAILABLE while the broker starts
                raise error
            raise StackError(f"topic {topic}: {meta.error}")
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)
            for p in sorted(meta.partitions)
        }

    try:
        return Retrying(
            retry=retry_if_exception(kafka_retriable),
            wait=wait_exponential(multiplier=0.1, max=2),
            stop=stop_after_delay(timeout_s),
            reraise=True,
        )(lookup)
    finally:
        consumer.close()


def delete_topic(settings: Settings, name: str, timeout_s: float = 30.0) -> None:
    admin = admin_client(settings)
    admin.delete_topics([name], operation_timeout=timeout_s)[name].result(timeout=timeout_s)
