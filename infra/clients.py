"""Where the project's Kafka and Redis clients are configured: one producer config, one consumer
config, one Redis client, each with the settings every user shares and a caller's overrides.

Every producer is durable: ``acks=all`` and idempotent (a retried batch is never appended twice),
lz4-compressed, with a 5 ms linger. A caller changes what its job needs: the API a short linger
and delivery timeouts (:func:`delivery_timeouts`), the generator :data:`THROUGHPUT`, a fault run
the guarantee under test. Consumers here read by ``assign()`` and never commit offsets. Nothing
here imports a client library until a client is built (the admin helpers and the stack's CLI
stay cheap to import).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The generator's batching: big lz4 batches, a deep queue, and no success reports (a Python call
# per event would cost more than producing it).
THROUGHPUT: dict[str, Any] = {
    "linger.ms": 20,
    "batch.size": 1_000_000,
    "batch.num.messages": 100_000,
    "queue.buffering.max.messages": 2_000_000,
    "queue.buffering.max.kbytes": 1_048_576,
    "delivery.report.only.error": True,
}

# One FCALL over a large group of records can keep Redis busy for seconds on a loaded machine, and
# every other client waits behind it; redis-py's default read timeout (5 s) would then fail a
# caller that only had to wait.
REDIS_SOCKET_TIMEOUT_S = 60


def producer_config(bootstrap: str, client_id: str, overrides: Mapping[str, Any] | None = None) -> dict:
    """The project's producer: durable (acks=all, idempotent), lz4, 5 ms linger; ``overrides`` win."""
    return {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "compression.type": "lz4",
        "linger.ms": 5,
        "client.id": client_id,
        **(overrides or {}),
    }


def delivery_timeouts(timeout_ms: int) -> dict[str, int]:
    """A producer that reports every record within ``timeout_ms``, delivered or not."""
    return {
        "message.timeout.ms": timeout_ms,
        # request.timeout.ms must not exceed message.timeout.ms (librdkafka checks it)
        "request.timeout.ms": min(timeout_ms, 30_000),
        "socket.connection.setup.timeout.ms": min(timeout_ms, 30_000),
    }


def consumer_config(bootstrap: str, group_id: str, overrides: Mapping[str, Any] | None = None) -> dict:
    """A reader that assigns its partitions itself: the group id names it, nothing is committed."""
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "enable.auto.commit": False,
        **(overrides or {}),
    }


def kafka_consumer(bootstrap: str, group_id: str, overrides: Mapping[str, Any] | None = None):
    """A ``confluent_kafka.Consumer`` of :func:`consumer_config`."""
    from confluent_kafka import Consumer

    return Consumer(consumer_config(bootstrap, group_id, overrides))


def redis_client(url: str, socket_timeout: float = REDIS_SOCKET_TIMEOUT_S, **kwargs):
    """A ``redis.Redis`` for ``url`` with a :data:`REDIS_SOCKET_TIMEOUT_S` read timeout."""
    import redis

    return redis.Redis.from_url(url, socket_timeout=socket_timeout, **kwargs)
