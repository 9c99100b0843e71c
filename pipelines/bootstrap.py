"""Bootstrap a new service from the compacted topics, never from ``social.events``.

What a new consumer does (:mod:`pipelines.speed.compacted` writes the topics): read
``<events topic>.<ns>.profiles`` and ``<events topic>.<ns>.follows`` from offset 0 up to their
end offsets at the start, keep the last value per key and drop a key whose last record is a
tombstone. That is the current follow graph and every profile, in time proportional to the live
state, not to the history.

``social-bootstrap`` does exactly that and then compares the result with the views in Redis
(the ``users``, ``status`` and ``following:<u>`` keys of the namespace) once the publisher has
caught up with the keyed state; it prints what it read and ``equal`` or the differences, and exits
1 when they differ.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from dataclasses import dataclass, field

import redis

from contract import functions, namespaces
from infra import clients
from infra.cli import command_name, run_main
from infra.settings import Settings, get_settings
from pipelines.speed import compacted


@dataclass
class Compacted:
    """The latest value per key of one compacted topic, read from offset 0."""

    topic: str
    values: dict[bytes, bytes] = field(default_factory=dict)
    records: int = 0  # records read (superseded ones included, until the cleaner removes them)
    tombstones: int = 0  # tombstones read (present until delete.retention.ms after cleaning)


def read_topic(settings: Settings, topic: str, timeout_s: float = 60.0) -> Compacted:
    """Every record of ``topic`` from offset 0 to the end offsets at the start, last value per key."""
    from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

    c = clients.kafka_consumer(
        settings,
        f"social.bootstrap.{uuid.uuid4().hex[:8]}",  # nothing committed
        {"enable.partition.eof": True},
    )
    out = Compacted(topic)
    try:
        meta = c.list_topics(topic, timeout=timeout_s).topics[topic]
        if meta.error is not None:
            raise RuntimeError(f"topic {topic}: {meta.error}")
        ends = {}
        for p in meta.partitions:
            _, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)
            if hi > 0:
                ends[p] = hi
        if not ends:
            return out
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        left = dict(ends)
        deadline = time.monotonic() + timeout_s
        while left:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: still {left} offsets to read after {timeout_s}s")
            msg = c.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    if msg.offset() >= ends.get(msg.partition(), 0):
                        left.pop(msg.partition(), None)
                    continue
                raise RuntimeError(f"{topic}: {msg.error()}")
            p = msg.partition()
            if p not in left:
                continue
            out.records += 1
            if msg.value() is None:
                out.tombstones += 1
                out.values.pop(msg.key(), None)
            else:
                out.values[msg.key()] = msg.value()
            if msg.offset() + 1 >= ends[p]:
                left.pop(p)
    finally:
        c.close()
    return out


@dataclass
class State:
    """Profiles (user -> dict) and the follow graph (follower, followee) of one namespace."""

    profiles: dict[int, dict]
    follows: set[tuple[int, int]]


def from_topics(settings: Settings, events_topic: str, namespace: str) -> tuple[State, dict]:
    """The state a new service builds from the two compacted topics alone; and what it read."""
    t = compacted.topic_names(events_topic, namespace)
    prof, fol = read_topic(settings, t.profiles), read_topic(settings, t.follows)
    profiles = {int(k): _profile(json.loads(v)) for k, v in prof.values.items()}
    follows = {_follow(k) for k in fol.values}
    read = {
        "profiles_records": prof.records,
        "profiles_tombstones": prof.tombstones,
        "follows_records": fol.records,
        "follows_tombstones": fol.tombstones,
    }
    return State(profiles, follows), read


def _follow(key: bytes) -> tuple[int, int]:
    """(follower, followee) of a follows record's key ``<follower>:<followee>``."""
    follower, followee = key.decode().split(":")
    return int(follower), int(followee)


def _profile(v: dict) -> dict:
    return {k: v.get(k) for k in ("handle", "display_name", "status", "status_time")}


def from_redis(client: redis.Redis, namespace: str, partitions: int | None = None) -> State:
    """The same two views as the keyed speed layer serves them (``users``, ``status``, ``following``;
    ``partitions``: of every partition in the partitioned layout)."""
    prefixes = (
        [functions.key(namespace)]
        if partitions is None
        else [functions.pkey(namespace, p) for p in range(partitions)]
    )
    users: dict[int, dict] = {}
    status: dict[int, dict] = {}
    follows: set[tuple[int, int]] = set()
    for pre in prefixes:
        users |= {int(u): json.loads(v) for u, v in client.hgetall(f"{pre}:users").items()}
        status |= {int(u): json.loads(v) for u, v in client.hgetall(f"{pre}:status").items()}
        follows |= _following(client, f"{pre}:following:")
    profiles = {}
    for u in set(users) | set(status):
        uj, sj = users.get(u, {}), status.get(u, {})
        profiles[u] = {
            "handle": uj.get("handle"),
            "display_name": uj.get("display_name"),
            "status": sj.get("text"),
            "status_time": sj.get("event_time"),
        }
    return State(profiles, follows)


def _following(client: redis.Redis, prefix: str) -> set[tuple[int, int]]:
    follows: set[tuple[int, int]] = set()
    keys = list(client.scan_iter(match=prefix + "*", count=2000))
    pipe = client.pipeline(transaction=False)
    for k in keys:
        pipe.smembers(k)
    for k, members in zip(keys, pipe.execute(), strict=True):
        u = int(k.decode()[len(prefix) :])
        follows |= {(u, int(m)) for m in members}
    return follows


def differences(a: State, b: State, limit: int = 5) -> list[str]:
    """What differs between two states (empty: equal), named by key, at most ``limit`` per view."""
    out = []
    keys = sorted(set(a.profiles) | set(b.profiles))
    bad = [u for u in keys if a.profiles.get(u) != b.profiles.get(u)]
    out += [f"profile {u}: topics {a.profiles.get(u)} != redis {b.profiles.get(u)}" for u in bad[:limit]]
    only_a, only_b = sorted(a.follows - b.follows), sorted(b.follows - a.follows)
    out += [f"follow {f}:{g} only in the topics" for f, g in only_a[:limit]]
    out += [f"follow {f}:{g} only in redis" for f, g in only_b[:limit]]
    return out


def wait_published(
    client: redis.Redis, namespace: str, timeout_s: float, partitions: int | None = None
) -> bool:
    """Block until the publisher's position reaches the keyed state's fences (bounded;
    ``partitions``: the partitioned layout's own fences)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if partitions is None:
            fences = functions.fences(client, namespace)
        else:
            fences = functions.layout_fences(client, namespace, "partitioned", partitions, whole=False)
        done = compacted.position(client, namespace, partitions)
        if all(done.get(p, -1) >= o for p, o in fences.items()):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=command_name("pipelines.bootstrap"), description=__doc__.splitlines()[0])
    p.add_argument("--namespace", help="views version (default: the active one)")
    p.add_argument(
        "--topic", help="event topic the compacted topics are named after (default: SOCIAL_EVENTS_TOPIC)"
    )
    p.add_argument("--wait", type=float, default=30.0, help="seconds to wait for the publisher to catch up")
    args = p.parse_args(argv)
    settings = get_settings()
    namespace = args.namespace or namespaces.active(settings)
    topic = args.topic or settings.events_topic
    client = functions.connect(settings.redis_url)
    partitions = None
    if settings.serving_layout == "partitioned":
        from pipelines.speed.stream import topic_partitions

        partitions = len(topic_partitions(settings, topic))
    caught_up = wait_published(client, namespace, args.wait, partitions)
    t0 = time.perf_counter()
    topics, read = from_topics(settings, topic, namespace)
    secs = time.perf_counter() - t0
    live = from_redis(client, namespace, partitions)
    diffs = differences(topics, live)
    names = compacted.topic_names(topic, namespace)
    print(f"read {names.profiles} and {names.follows} from offset 0 in {secs:.2f}s: {read}")
    print(f"bootstrapped {len(topics.profiles)} profiles and {len(topics.follows)} follow edges")
    print(f"redis {namespace}: {len(live.profiles)} profiles and {len(live.follows)} follow edges")
    if not caught_up:
        print(f"warning: the publisher had not caught up with the keyed state after {args.wait}s")
    if diffs:
        print("NOT equal:")
        for d in diffs:
            print(f"  {d}")
        return 1
    print("equal")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "pipelines.bootstrap"))
