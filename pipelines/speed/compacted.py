"""Compacted topics: the latest value per entity, so a new service can start without all of history.

Where it sits: ``Redis changelog:<p> streams -> [this, a thread beside the keyed query] -> Kafka``.
After every micro-batch of the keyed speed layer (:mod:`pipelines.speed.stream`) the publisher
reads the changelog entries the batch left in Redis (:mod:`pipelines.speed.changelog`), from its
own position up to one consistent cut, and produces one keyed record per changed entity to two
topics with ``cleanup.policy=compact``, named after the event topic and the namespace:

==============================  ===================  =============================================
``<events topic>.<ns>.profiles``  key ``<user_id>``    JSON ``{user_id, handle, display_name, status,
                                                     status_time}`` (the ``users`` and
                                                     ``user_status`` views of docs/views.md; a
                                                     field is null where its view has no row);
                                                     a tombstone (null value) once both are gone
                                                     (``user_erased``)
``<events topic>.<ns>.follows``   key ``<u>:<followee>``  ``followed_at`` (ms, decimal: the ``follows`` view);
                                                     a tombstone on unfollow or on the erasure of
                                                     either side (every ``F-`` change)
==============================  ===================  =============================================

Kafka keeps at least the last record of every key (and drops tombstones ``delete.retention.ms``
after the cleaner first saw them), so reading both topics from offset 0 gives the current follow
graph and profiles without reading ``social.events`` (:mod:`pipelines.bootstrap`).

Exactly which values: a follow edge's record is the change itself (``F+``/``F-`` are absolute).
A profile's record is what Redis holds for the user when the publisher reads it (``users`` and
``status``, one round trip per run), at or after the cut: a ``U`` change carries no status and an
``S`` change no handle, so the whole profile is read, and any later change of the same user is
published again later, so the last record of every key is the current value.

Idempotent: records are produced in the cut's sequence order (a change of one key from two
partitions keeps its order; each key has one Kafka partition), flushed (acks=all, idempotent
producer, as the API and the generator), and only then is the position ``<ns>:published``
(partition -> next offset published) advanced. A crash in between re-produces the same range
with the same absolute values: a compacted topic keeps the last one, so a duplicate is harmless.
The archiver trims a changelog stream only below that position, so nothing is trimmed unpublished.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial

import redis

from contract.functions import key, pkey
from infra import clients
from infra.settings import Settings
from pipelines.speed import changelog

log = logging.getLogger("speed_layer.compacted")

POSITION = "published"  # <ns>:published hash: partition -> next offset whose changes are in Kafka
# Change kinds whose first key is a user whose profile they change. ``U``/``S`` set it; the
# erasure of a user (``user_erased``) removes it, logged under any of the others.
PROFILE_KINDS = frozenset({"U", "S", "U-", "S-", "E", "X"})
MAX_PER_PARTITION = 20_000  # changelog entries read per partition and run (bounds a catch-up's memory)
_TOPIC_OK = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


@dataclass(frozen=True)
class Topics:
    profiles: str
    follows: str


def topic_names(events_topic: str, namespace: str) -> Topics:
    """``<events topic>.<namespace>.profiles`` and ``....follows`` (a views version has its own)."""
    t = Topics(f"{events_topic}.{namespace}.profiles", f"{events_topic}.{namespace}.follows")
    for name in (t.profiles, t.follows):
        if not _TOPIC_OK.match(name):
            raise ValueError(f"compacted topic name {name!r} is not a legal Kafka topic name")
    return t


def topic_configs(settings: Settings) -> dict[str, str]:
    """The compacted topics' configs (each a setting, see docs/configuration.md)."""
    return {
        "cleanup.policy": "compact",
        "delete.retention.ms": str(settings.compacted_delete_retention_ms),
        "min.cleanable.dirty.ratio": str(settings.compacted_min_cleanable_dirty_ratio),
        "segment.ms": str(settings.compacted_segment_ms),
        "min.insync.replicas": "1",
        "unclean.leader.election.enable": "false",
    }


def ensure_topics(settings: Settings, events_topic: str, namespace: str) -> Topics:
    from infra.stack import create_topic

    t = topic_names(events_topic, namespace)
    for name in (t.profiles, t.follows):
        create_topic(settings, name, settings.compacted_partitions, topic_configs(settings))
    return t


# --- what to produce (pure: unit-tested on hand-written entries) ----------------------------------


def _changes(entry: dict) -> list[list]:
    return json.loads(entry["changes"]) if entry.get("changes") else []


def touched_users(entries: Iterable[dict]) -> list[int]:
    """Users whose profile the entries changed, in first-change order."""
    seen: dict[int, None] = {}
    for e in entries:
        for ch in _changes(e):
            if ch[0] in PROFILE_KINDS:
                seen.setdefault(int(ch[1]), None)
    return list(seen)


def profile_value(user: int, user_json: bytes | str | None, status_json: bytes | str | None) -> bytes | None:
    """The profile record's value from Redis's ``users`` and ``status`` entries; None (a
    tombstone) when the user has neither (erased, or never had a profile)."""
    if user_json is None and status_json is None:
        return None
    u = json.loads(user_json) if user_json is not None else {}
    s = json.loads(status_json) if status_json is not None else {}
    return json.dumps(
        {
            "user_id": user,
            "handle": u.get("handle"),
            "display_name": u.get("display_name"),
            "status": s.get("text"),
            "status_time": s.get("event_time"),
        },
        separators=(",", ":"),
    ).encode()


def follow_records(entries: Iterable[dict]) -> list[tuple[bytes, bytes | None]]:
    """``(key, value)`` of the follows topic for every ``F+``/``F-`` change, in entry order."""
    out: list[tuple[bytes, bytes | None]] = []
    for e in entries:
        for ch in _changes(e):
            if ch[0] == "F+":
                out.append((f"{ch[1]}:{ch[2]}".encode(), str(int(ch[3])).encode()))
            elif ch[0] == "F-":
                out.append((f"{ch[1]}:{ch[2]}".encode(), None))
    return out


def profile_records(
    entries: list[dict], read_profiles: Callable[[list[int]], list[tuple]]
) -> list[tuple[bytes, bytes | None]]:
    """``(key, value)`` of the profiles topic for every user the entries touched.

    ``read_profiles(users)`` returns ``(user_json, status_json)`` per user (Redis's entries).
    """
    users = touched_users(entries)
    if not users:
        return []
    return [
        (str(u).encode(), profile_value(u, uj, sj))
        for u, (uj, sj) in zip(users, read_profiles(users), strict=True)
    ]


def consistent_prefix(per_p: dict[int, list[dict]], truncated: set[int]) -> tuple[list[dict], dict[int, int]]:
    """The entries to publish in one run, in sequence order, and the partitions whose position
    must stop earlier than what was read (partition -> first offset left for the next run).

    When some partitions' reads were cut short (``truncated``), only the entries up to the
    smallest last sequence number among those are published: an entry with a larger one may
    follow, in another partition's unread part, a change of the same key that must go first.
    """
    cutoff = min((per_p[p][-1]["seq"] for p in truncated if per_p.get(p)), default=None)
    entries: list[dict] = []
    back: dict[int, int] = {}
    for p, got in per_p.items():
        if cutoff is not None:
            late = [e for e in got if e["seq"] > cutoff]
            if late:
                back[p] = late[0]["offset"]
                got = [e for e in got if e["seq"] <= cutoff]
        entries += got
    entries.sort(key=lambda e: e["seq"])  # one order across partitions: the order Redis applied them
    return entries, back


# --- the publisher ----------------------------------------------------------------------------------


@dataclass
class Published:
    entries: int = 0
    profiles: int = 0
    follows: int = 0
    tombstones: int = 0
    ms: float = 0.0
    upto: dict[int, int] = field(default_factory=dict)
    more: bool = False  # a bounded run: more of the changelog is waiting


def position(client: redis.Redis, namespace: str, partitions: int | None = None) -> dict[int, int]:
    """Partition -> next offset whose changes are in the compacted topics (``partitions``: the
    partitioned layout's, one ``{<p>}:published`` per partition, a settled cut)."""
    if partitions is not None:
        pipe = client.pipeline(transaction=False)
        for p in range(partitions):
            pipe.get(pkey(namespace, p, POSITION))
        return {p: int(v) for p, v in enumerate(pipe.execute()) if v is not None}
    raw = client.hgetall(key(namespace, POSITION))
    return {int(p): int(o) for p, o in raw.items()}


class Publisher:
    """Produces the changes of the changelog tail in Redis to the compacted topics."""

    def __init__(
        self, settings: Settings, namespace: str, events_topic: str, client: redis.Redis | None = None
    ):

        self.settings, self.namespace = settings, namespace
        self.r = client or clients.redis_client(settings.redis_url)
        self.topics = ensure_topics(settings, events_topic, namespace)
        # the "kept" profile: zstd, and Java's key partitioner, so a Java or Kafka Streams producer of
        # the same keys picks the same partitions
        self.producer = clients.kafka_producer(settings, "speed_layer.compacted", "kept")
        self.timeout_s = 30.0
        self.max_per_partition = MAX_PER_PARTITION
        self.cuts: changelog.SettledCuts | None = None
        if settings.serving_layout == "partitioned":
            from pipelines.speed.stream import topic_partitions

            self.cuts = changelog.SettledCuts(
                self.r, namespace, len(topic_partitions(settings, events_topic))
            )

    def _read_profiles(self, users: list[int], partition: int | None = None) -> list[tuple]:
        def k(name: str) -> str:
            return key(self.namespace, name) if partition is None else pkey(self.namespace, partition, name)

        pipe = self.r.pipeline(transaction=False)
        pipe.hmget(k("users"), users)
        pipe.hmget(k("status"), users)
        uj, sj = pipe.execute()
        return list(zip(uj, sj, strict=True))

    def _partitioned_run(self) -> tuple[list[dict], list[tuple[bytes, bytes | None]], dict[int, int]] | None:
        """The partitioned layout's run: every partition's entries caused from the published cut up
        to the newest settled one (:class:`pipelines.speed.changelog.SettledCuts`), each partition
        in its own order (a key's changes are all in its owner's partition), and the profiles read
        from each user's partition. Never bounded: only a settled cut is a prefix of every stream."""
        assert self.cuts is not None
        cut = self.cuts().fences
        done = position(self.r, self.namespace, self.cuts.partitions)
        start = {p: done.get(p, 0) for p in cut}
        if any(start[p] > cut[p] for p in cut):  # Redis came back older: wait for the speed layer
            return None
        if start == cut:
            return None
        entries, profiles = [], []
        for p in cut:
            got = changelog.read_partitioned(self.r, self.namespace, p, start, cut)
            entries += got
            profiles += profile_records(got, partial(self._read_profiles, partition=p))
        return entries, profiles, cut

    def publish_once(self) -> Published:
        """Publish every change from the published position up to a consistent cut; flush; advance."""
        t0 = time.perf_counter()
        upto: dict[int, int]  # the position published up to, per partition
        if self.cuts is not None:
            run = self._partitioned_run()
            if run is None:
                return Published()
            entries, profiles, upto = run
            out = Published(entries=len(entries), upto=upto)
            self._produce(out, entries, profiles)
            pipe = self.r.pipeline(transaction=False)
            for p, o in upto.items():
                pipe.set(pkey(self.namespace, p, POSITION), o)
            pipe.execute()
            out.ms = (time.perf_counter() - t0) * 1000
            return out
        cut = changelog.cut(self.r, self.namespace)
        done = position(self.r, self.namespace)
        per_p: dict[int, list[dict]] = {}
        upto = {}
        truncated: set[int] = set()
        for p, end in cut.fences.items():
            start = done.get(p)
            if start is None:  # first run in this namespace: from the oldest entry Redis holds
                start = changelog.first_offset(self.r, self.namespace, p)
                start = end if start is None else start
            if start < end:
                bound = min(end, start + self.max_per_partition)  # a catch-up in bounded runs
                per_p[p] = changelog.read(self.r, self.namespace, p, start, bound)
                upto[p] = bound
                if bound < end:
                    truncated.add(p)
            elif p not in done:
                upto[p] = end
        entries, cut_back = consistent_prefix(per_p, truncated)
        upto.update(cut_back)
        out = Published(entries=len(entries), upto=upto, more=bool(truncated))
        if not upto:
            return out
        self._produce(out, entries, profile_records(entries, self._read_profiles))
        # a copy typed as redis-py's mapping (its key type is a union: a dict[int, int] is no such Mapping)
        self.r.hset(key(self.namespace, POSITION), mapping={p: o for p, o in upto.items()})
        out.ms = (time.perf_counter() - t0) * 1000
        return out

    def _produce(
        self, out: Published, entries: list[dict], profiles: list[tuple[bytes, bytes | None]]
    ) -> None:
        """Produce the follows and profiles records of a run and flush (raises unless all are in)."""
        errors: list[str] = []

        def report(err, _msg) -> None:
            if err is not None:
                errors.append(str(err))

        # sorted by key (a stable sort: each key's records keep their order), so that neighbouring
        # records share prefixes (zstd then packs a follow edge in ~10 bytes)
        for topic, records in (
            (self.topics.follows, sorted(follow_records(entries), key=lambda kv: kv[0])),
            (self.topics.profiles, profiles),
        ):
            for k, v in records:
                while True:
                    try:
                        self.producer.produce(topic, key=k, value=v, on_delivery=report)
                        break
                    except BufferError:  # the local queue is full (a catch-up): let it drain
                        self.producer.poll(0.5)
                out.tombstones += v is None
            if topic == self.topics.follows:
                out.follows = len(records)
            else:
                out.profiles = len(records)
            self.producer.poll(0)
        left = self.producer.flush(self.timeout_s)
        if left or errors:
            raise RuntimeError(
                f"compacted topics: {left} records not delivered, errors {errors[:3]}; position kept"
            )


class PublisherThread(threading.Thread):
    """Runs :meth:`Publisher.publish_once` after every micro-batch (``wake``), off the query's path:
    the next micro-batch never waits for it. A failure (the broker away) is logged and retried;
    the position stays, so nothing is lost, and the archiver keeps the unpublished tail in Redis."""

    def __init__(self, settings: Settings, namespace: str, events_topic: str, idle_s: float = 1.0):
        super().__init__(name="compacted-topics", daemon=True)
        self.settings, self.namespace, self.events_topic = settings, namespace, events_topic
        self.idle_s = idle_s
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self.batches = 0
        self.total_ms = 0.0

    def wake(self, *_args) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def run(self) -> None:
        publisher = None
        backoff = 1.0
        while True:
            self._wake.wait(self.idle_s)
            self._wake.clear()
            last = self._stopping.is_set()  # one more run after stop: what the last batches left
            try:
                publisher = publisher or Publisher(self.settings, self.namespace, self.events_topic)
                got = publisher.publish_once()
                backoff = 1.0
            except Exception:  # noqa: BLE001 - logged loudly and retried; serving goes on
                log.exception("compacted topics: publish failed; retrying in %.0fs", backoff)
                if last:
                    return
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            if got.more:  # catching up: the next run at once
                self._wake.set()
            if got.entries:
                self.batches += 1
                self.total_ms += got.ms
                log.info(
                    "compacted topics: %d entries -> %d profiles, %d follows (%d tombstones) in %.1f ms",
                    got.entries,
                    got.profiles,
                    got.follows,
                    got.tombstones,
                    got.ms,
                )
            if last:
                return
