"""The API's only way to change anything: append one event to the log and await the broker's ack.

``EventLog.append(event)`` validates against the contract (nothing invalid is ever appended),
produces with the contract's record key, and resolves once the broker acknowledged the record
(acks=all, idempotent producer) with its partition and offset, or raises :class:`LogUnavailable`
within ``api_produce_timeout_ms`` (librdkafka's ``message.timeout.ms``: the delivery report then
says the record was *not* written, so a 503 never hides a write that succeeded... except in the one
case Kafka cannot rule out, a timeout after the broker appended; the client's retry with the
same ``Idempotency-Key`` then becomes a duplicate that the speed layer drops).

Delivery reports arrive on a dedicated poll thread and are handed to the event loop with
``call_soon_threadsafe``; requests never block the loop on the broker.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass

import orjson
from confluent_kafka import KafkaException

import contract
from infra import clients

_quiet = logging.getLogger("app_sim.api.librdkafka")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False


class LogUnavailable(RuntimeError):
    """The broker did not acknowledge the event in time (or refused it): nothing was promised."""


class InvalidEvent(ValueError):
    """The API built an event the contract rejects (a bug, or input the models let through)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Appended:
    partition: int
    offset: int


def producer(kafka: clients.Kafka, timeout_ms: int):
    """The project's durable producer (acks=all, idempotent), latency-minded: a short linger
    (requests batch anyway) and every record reported within ``timeout_ms``."""
    overrides = {**clients.delivery_timeouts(timeout_ms), "logger": _quiet}
    return clients.kafka_producer(kafka, "app_sim.api", "request", overrides=overrides)


class EventLog:
    def __init__(self, kafka: clients.Kafka, topic: str, timeout_ms: int = 5000):
        self.topic = topic
        self.timeout_ms = timeout_ms
        self._producer = producer(kafka, timeout_ms)
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="eventlog-poll", daemon=True)
        self._poller.start()

    def partitions(self, default: int, timeout_s: float = 5.0) -> int:
        """The topic's partition count as the broker reports it (``default`` when it cannot say:
        the topic does not exist yet). The partitioned layout reads each user's keys from the
        partition the user's records go to, which this count decides."""
        try:
            meta = self._producer.list_topics(self.topic, timeout=timeout_s).topics.get(self.topic)
        except Exception:  # noqa: BLE001 - a broker not answering yet: the appends will say so
            return default
        if meta is None or meta.error is not None or not meta.partitions:
            return default
        return len(meta.partitions)

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)

    async def append(self, event: dict) -> Appended:
        reason = contract.validate(event)
        if reason is not None:
            raise InvalidEvent(reason)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Appended] = loop.create_future()

        def on_delivery(err, msg) -> None:  # on the poll thread
            if err is not None:
                result: Appended | Exception = LogUnavailable(f"not appended: {err.str()}")
            else:
                result = Appended(msg.partition(), msg.offset())
            try:
                loop.call_soon_threadsafe(_resolve, done, result)
            except RuntimeError:  # the loop is closed (shutdown): nobody waits; the outcome stays in the log
                pass

        try:
            self._producer.produce(
                self.topic, orjson.dumps(event), contract.record_key(event), on_delivery=on_delivery
            )
        except BufferError:
            raise LogUnavailable("producer queue full (broker unreachable or too slow)") from None
        except KafkaException as exc:
            raise LogUnavailable(f"not appended: {exc.args[0].str()}") from None
        # librdkafka always reports within message.timeout.ms; the extra second only guards a bug
        try:
            return await asyncio.wait_for(done, self.timeout_ms / 1000 + 1.0)
        except TimeoutError:
            raise LogUnavailable("no delivery report in time") from None

    def close(self, timeout_s: float = 10.0) -> int:
        """Flush what is in flight; returns how many records were left undelivered."""
        left = self._producer.flush(timeout_s)
        self._stop.set()
        self._poller.join(timeout=1)
        return left


def _resolve(future: asyncio.Future, result) -> None:
    if future.done():  # the request was cancelled (client went away); the outcome stays in the log
        return
    if isinstance(result, Exception):
        future.set_exception(result)
    else:
        future.set_result(result)
