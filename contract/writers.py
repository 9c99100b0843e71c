"""The registry of snowflake worker ids: every writer of the log gets one no other writer ever had.

Where it sits in the data flow::

    writer starts (API process, generator run, --inject, fault run)
        ──claim──> Kafka <events topic>.writers (compacted, 1 partition, kept forever)
    writer runs: post_id / message_id / user_id snowflakes carry that worker id (contract/ids.py)
        ──append──> Kafka social.events ──> speed layer ──> Redis, Delta

Snowflakes are ``41 bits ms | 10 bits worker | 12 bits sequence``; two writers with the same
worker id and overlapping clocks mint the same ids (two authors with one post_id). So the worker
id is not a default or a host-local lock: it is allocated here, in Kafka, beside the log it is
for, where a Redis FLUSHALL, a restore or a restarted host cannot reset it. The registry topic is
``SOCIAL_WRITERS_TOPIC`` (empty: ``<events topic>.writers``), so each log has its own.

A claim is one record: key a new UUID (never reused, so compaction never drops a claim), value
JSON ``{"worker_id", "kind", "pid", "host", "claimed_at"}`` (``kind``: ``api``, ``generator``,
``inject`` or ``faults``; ``claimed_at``: epoch ms).
Allocation (:func:`allocate`):

1. read the topic from offset 0 to its end: the ids claimed so far;
2. pick the lowest worker id not claimed yet and produce a claim for it (acks=all, idempotent);
3. read up to that claim: **the claim at the lowest offset wins an id**; if an earlier claim of
   another writer has it (a race: both read the same end), go back to 2 with the next free id.

An id is never given back (a writer that stops leaves its claim): ids are unique for the life of
the log, 1024 writers per log. When every id is claimed, or Kafka does not answer, the writer
refuses to start with one line (:class:`WriterIdUnavailable`); the CLIs print it and exit non-zero.

``python -m contract.writers`` lists the claims of the log (``--topic`` for another log).
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, replace

import orjson

from contract.ids import MAX_WORKER_ID
from infra import clients
from infra.cli import command_name, run_main
from infra.settings import Settings, get_settings
from infra.stack import ensure_writers_topic, writers_topic, writers_topic_configs

# the registry topic: named, configured and created by the ground floor (the stack creates it too)
registry_topic, topic_configs, ensure_topic = writers_topic, writers_topic_configs, ensure_writers_topic

WORKER_IDS = MAX_WORKER_ID + 1  # 1024 worker ids per log

_quiet = logging.getLogger("contract.writers.librdkafka")  # one clear line, not librdkafka's retries
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False


class WriterIdUnavailable(RuntimeError):
    """No worker id for this writer: every id of the log is claimed, or Kafka did not answer.
    The message is one line that says what to do; a writer that gets this must not start."""


@dataclass(frozen=True)
class Claim:
    """A won claim: this writer's worker id, and where its claim sits in the registry."""

    worker_id: int
    kind: str
    key: str
    topic: str
    offset: int


def claim_value(worker_id: int, kind: str) -> bytes:
    return orjson.dumps(
        {
            "worker_id": worker_id,
            "kind": kind,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "claimed_at": time.time_ns() // 1_000_000,
        }
    )


def owners(
    records: Iterable[tuple[int, bytes | None]], owned: dict[int, int] | None = None
) -> dict[int, int]:
    """Worker id -> offset of the claim that won it (the lowest offset), from ``(offset, value)``
    records in any order; ``owned`` (updated in place) carries what earlier reads found. Records
    that are not claims (not JSON, no integer ``worker_id`` in range) are ignored."""
    owned = {} if owned is None else owned
    for offset, value in records:
        try:
            wid = orjson.loads(value)["worker_id"] if value is not None else None
        except (orjson.JSONDecodeError, TypeError, KeyError):
            continue
        if type(wid) is not int or not 0 <= wid <= MAX_WORKER_ID:
            continue
        if offset < owned.get(wid, offset + 1):
            owned[wid] = offset
    return owned


def lowest_free(owned: dict[int, int], max_ids: int = WORKER_IDS) -> int | None:
    return next((w for w in range(max_ids) if w not in owned), None)


class _Registry:
    """One writer's view of the registry: a consumer at the position read so far, a producer."""

    def __init__(self, settings: Settings, topic: str, timeout_s: float):
        from confluent_kafka import TopicPartition

        self.topic = topic
        self.timeout_s = timeout_s
        self.tp = TopicPartition(topic, 0)
        self.consumer = clients.kafka_consumer(
            settings,
            f"{topic}.reader",  # assign() only: nothing is ever committed
            {
                "fetch.wait.max.ms": 20,  # at the end of the registry: answer now, not in 500 ms
                "auto.offset.reset": "earliest",
                "logger": _quiet,
            },
        )
        # from offset 0 (the registry is never truncated; "earliest" if it were): OFFSET_BEGINNING
        # would cost an offset lookup, half a second
        self.consumer.assign([TopicPartition(topic, 0, 0)])
        self.producer = clients.kafka_producer(
            settings,
            "contract.writers",
            overrides={"message.timeout.ms": int(timeout_s * 1000), "logger": _quiet},
        )
        self.next_offset = 0  # the next offset this reader has not seen
        self.owned: dict[int, int] = {}  # worker id -> offset of its winning claim
        self.records: list[tuple[int, bytes | None, bytes | None]] = []  # (offset, key, value) read

    def end(self) -> int:
        from confluent_kafka import KafkaError, KafkaException

        from infra.stack import kafka_retriable

        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                return self.consumer.get_watermark_offsets(self.tp, timeout=self.timeout_s)[1]
            except KafkaException as exc:  # a just-created topic is unknown or leaderless for a moment
                young = exc.args[0].code() in (
                    KafkaError._UNKNOWN_PARTITION,
                    KafkaError.UNKNOWN_TOPIC_OR_PART,
                )
                if not (young or kafka_retriable(exc)) or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def read_to(self, end: int) -> None:
        """Read every record below offset ``end`` (at least); fold the claims into ``owned``."""
        from confluent_kafka import KafkaException

        deadline = time.monotonic() + self.timeout_s
        while self.next_offset < end:
            if time.monotonic() > deadline:
                raise TimeoutError(f"read {self.next_offset} of {end} records in {self.timeout_s:.0f} s")
            msg = self.consumer.poll(0.05)  # returns as soon as a record is there
            if msg is None:  # a compacted log may have gaps: the position says how far we are
                self.next_offset = max(self.next_offset, self.consumer.position([self.tp])[0].offset)
                continue
            if msg.error() is not None:
                if msg.error().fatal():
                    raise KafkaException(msg.error())
                continue  # e.g. a leader moving: librdkafka fetches again
            self.records.append((msg.offset(), msg.key(), msg.value()))
            owners([(msg.offset(), msg.value())], self.owned)
            self.next_offset = max(self.next_offset, msg.offset() + 1)

    def claim(self, worker_id: int, kind: str) -> tuple[str, int]:
        """Produce a claim for ``worker_id``; its key and offset once acknowledged."""
        key = str(uuid.uuid4())
        report: list = []
        self.producer.produce(
            self.topic,
            claim_value(worker_id, kind),
            key.encode(),
            partition=0,
            on_delivery=lambda err, msg: report.append((err, msg.offset() if err is None else None)),
        )
        self.producer.flush(self.timeout_s + 1)
        if not report:
            raise TimeoutError(f"no acknowledgement of the claim in {self.timeout_s:.0f} s")
        err, offset = report[0]
        if err is not None:
            raise RuntimeError(f"the claim was not written: {err.str()}")
        return key, offset

    def close(self) -> None:
        self.consumer.close()


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def allocate(
    settings: Settings,
    kind: str,
    *,
    events_topic: str | None = None,
    max_ids: int = WORKER_IDS,
    timeout_s: float = 30.0,
) -> Claim:
    """Claim the lowest worker id no writer of this log ever had (see the module docstring).

    ``settings.kafka_bootstrap`` is the cluster, ``events_topic`` (default the settings') the log;
    ``max_ids`` limits the ids handed out (tests exhaust a registry with a small one). Raises
    :class:`WriterIdUnavailable` with a one-line message when no id can be had.
    """
    from confluent_kafka import KafkaException

    from infra.stack import StackError, admin_client

    if not 1 <= max_ids <= WORKER_IDS:
        raise ValueError(f"max_ids must be in 1..{WORKER_IDS}, got {max_ids}")
    topic = registry_topic(settings, events_topic)
    where = f"Kafka at {settings.kafka_bootstrap}"
    try:
        admin_client(settings).list_topics(timeout=min(timeout_s, 10.0))
    except KafkaException as exc:
        raise WriterIdUnavailable(
            f"no snowflake worker id for this {kind}: {where} did not answer "
            f"({_one_line(exc.args[0].str())}); start it (`make up`) or set SOCIAL_KAFKA_BOOTSTRAP"
        ) from None
    registry = None
    try:
        ensure_topic(settings, events_topic, timeout_s)
        registry = _Registry(settings, topic, timeout_s)
        registry.read_to(registry.end())
        while True:
            wid = lowest_free(registry.owned, max_ids)
            if wid is None:
                raise WriterIdUnavailable(
                    f"no snowflake worker id for this {kind}: all {max_ids} worker ids of this log are "
                    f"claimed in {topic} ({len(registry.records)} claims; ids are never reused within a log); "
                    "start a new log (`make clean`, or another SOCIAL_EVENTS_TOPIC)"
                )
            key, offset = registry.claim(wid, kind)
            registry.read_to(offset + 1)
            if registry.owned.get(wid) == offset:
                return Claim(worker_id=wid, kind=kind, key=key, topic=topic, offset=offset)
            # an earlier claim of another writer won this id: try the next free one
    except WriterIdUnavailable:
        raise
    except (KafkaException, StackError, TimeoutError, RuntimeError) as exc:
        detail = exc.args[0].str() if isinstance(exc, KafkaException) else str(exc)
        raise WriterIdUnavailable(
            f"no snowflake worker id for this {kind}: the registry {topic} on {where} failed "
            f"({_one_line(detail)})"
        ) from None
    finally:
        if registry is not None:
            registry.close()


def allocate_for(
    bootstrap: str | Settings, events_topic: str, kind: str, settings: Settings | None = None
) -> Claim:
    """:func:`allocate` for a writer that names its cluster and log (the generator's ``--bootstrap``
    and ``--topic``), with the other settings (profile, ``SOCIAL_WRITERS_TOPIC``) from ``settings``
    or the environment; a ``bootstrap`` given as settings is the cluster with its security."""
    if not isinstance(bootstrap, str):
        return allocate(bootstrap, kind, events_topic=events_topic)
    base = settings or get_settings()
    return allocate(replace(base, kafka_bootstrap=bootstrap), kind, events_topic=events_topic)


def read_claims(settings: Settings, events_topic: str | None = None, timeout_s: float = 30.0) -> list[dict]:
    """Every claim of the registry in offset order, each with ``offset``, ``key`` and ``won``
    (whether it owns its worker id)."""
    registry = _Registry(settings, registry_topic(settings, events_topic), timeout_s)
    try:
        registry.read_to(registry.end())
    finally:
        registry.close()
    out = []
    for offset, key, value in registry.records:
        if value is None:  # a tombstone
            continue
        try:
            claim = orjson.loads(value)
        except (orjson.JSONDecodeError, TypeError):
            continue
        if isinstance(claim, dict):
            won = "worker_id" in claim and registry.owned.get(claim["worker_id"]) == offset
            out.append({"offset": offset, "key": (key or b"").decode(errors="replace"), **claim, "won": won})
    return out


def main(argv: list[str] | None = None) -> int:
    settings = get_settings()
    p = argparse.ArgumentParser(prog=command_name("contract.writers"), description=__doc__.splitlines()[0])
    p.add_argument("--topic", default=settings.events_topic, help="the event log whose registry to list")
    a = p.parse_args(argv)
    try:
        claims = read_claims(settings, a.topic)
    except Exception as exc:  # noqa: BLE001 - a listing: say why in one line
        print(f"cannot read {registry_topic(settings, a.topic)}: {_one_line(exc)}", file=sys.stderr)
        return 1
    print(
        f"{registry_topic(settings, a.topic)}: {len(claims)} claims, {sum(c['won'] for c in claims)} worker ids"
    )
    for c in claims:
        print(
            f"  offset {c['offset']:>5}  worker {c.get('worker_id')!s:>4}  {c.get('kind', '?'):<9}"
            f" pid {c.get('pid')} on {c.get('host')}  {'' if c['won'] else '(lost the race)'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "contract.writers"))
