"""The keyed processor: Kafka records of one partition, in offset order -> Redis, exactly once.

Where it sits: ``Kafka social.events -> [this, in the Spark executors] -> Redis functions``.
Each record is checked against the event contract in Python (the same compiled validator the
API uses, :func:`contract.parse_and_validate`), encoded as the flat arguments of the
``social_apply`` Redis function (:mod:`contract.redis_functions`) and sent in groups, so
a run of events costs one round trip and Redis does the fan-out, the fences, the dedup and the
changelog atomically per event. Nothing here keeps state between records: the state is Redis.

The same :class:`Processor` runs in the live stream (:mod:`pipelines.speed.stream`), in the
replay into a scratch namespace (:mod:`pipelines.replay`) and in the unit tests.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import redis

import contract
from contract import functions
from infra import clients
from infra.settings import DEDUP_GRACE_MS, DEDUP_REORDER, DEDUP_WINDOW_MS, FANOUT_THRESHOLD, TIMELINE_LENGTH

EVENT_ARGS = 10
FRESHNESS_BUCKET_MS = 10  # the freshness histogram's resolution (received -> applied in Redis)
FRESHNESS_CAP_MS = 120_000  # longer delays share the last bucket (simulated clocks are days off)


@dataclass(frozen=True)
class ProcessorConfig:
    """Everything an executor needs to process records (picklable: shipped to the workers)."""

    redis_url: str
    namespace: str
    timeline_length: int = TIMELINE_LENGTH
    timeline_slack: int = 200  # kept beyond N so removals rarely need a refill (see the Lua module)
    fanout_threshold: int = FANOUT_THRESHOLD
    dedup_window_ms: int = DEDUP_WINDOW_MS
    dedup_grace_ms: int = DEDUP_GRACE_MS
    dedup_reorder: int = DEDUP_REORDER
    group_size: int = 200  # events per FCALL: one atomic run, one round trip shared by a pipeline
    # posts per FCALL: a call runs alone in Redis and reads wait behind it, and a post is the
    # costly event (one insert per follower), so a group also ends at this many posts
    group_posts: int = 200
    record_freshness: bool = True
    layout: str = "keyed"  # SOCIAL_SERVING_LAYOUT: keyed (this module) or partitioned (speed/partitioned.py)
    partitions: int = 0  # the event topic's partitions (the partitioned layout delivers to each)


def encode(offset: int, value: bytes | None) -> list:
    """One record as the EVENT_ARGS arguments of ``social_apply`` (see the Lua module's header)."""
    if value is None:
        return [offset, "!", "", "", "", "", "", "", "bad_json", ""]
    try:
        event, reason = contract.parse_and_validate(value)
    except Exception as exc:  # a bug in the contract code must not stop the stream either
        event, reason = None, f"processing_error:{type(exc).__name__}"
    if event is None:  # parse_and_validate gives an event or a reason, never both
        return [offset, "!", "", "", "", "", "", "", reason, ""]
    e = event
    t = e["type"]
    event_time = e["device_time"] + (e["received_time"] - e["sent_time"])
    head = [offset, t, e["event_id"], e["user_id"], e["received_time"], event_time]
    if t == "post_created":
        return head + [e["post_id"], "", e["text"], ""]
    if t in ("followed", "unfollowed"):
        return head + [e["followee_id"], "", "", ""]
    if t == "post_deleted":
        return head + [e["post_id"], "", "", ""]
    if t == "message_sent":  # keyed by the recipient: the inbox's owner is the "user" here
        head[3] = e["recipient_id"]
        return head + [e["message_id"], e["user_id"], e["text"], ""]
    if t == "message_read":
        return head + [e["message_id"], "", "", ""]
    if t == "status_updated":
        return head + ["", "", e["text"], ""]
    if t == "user_registered":
        return head + ["", "", e["handle"], e["display_name"]]
    if t == "user_erased":
        return head + ["", "", "", ""]
    return [offset, "!", "", "", "", "", "", "", "unknown_type", ""]


@dataclass
class Applied:
    """What one call of :meth:`Processor.process` did (counts per disposition)."""

    records: int = 0
    applied: int = 0
    duplicates: int = 0
    rejected: int = 0
    quarantined: int = 0
    skipped: int = 0  # below the partition's fence: applied by an earlier (crashed) attempt
    fcalls: int = 0

    def add(self, counts: list[int]) -> None:
        a, d, r, q, s = map(int, counts)
        self.applied += a
        self.duplicates += d
        self.rejected += r
        self.quarantined += q
        self.skipped += s
        self.fcalls += 1


class Processor:
    """Applies records to the keyed state in Redis through the project's Redis functions."""

    def __init__(self, cfg: ProcessorConfig, client: redis.Redis | None = None):
        self.cfg = cfg
        self.r = client or clients.redis_client(cfg.redis_url)
        functions.refuse_keyed_on_cluster(self.r)
        functions.ensure_loaded(self.r)
        self._head = [
            cfg.namespace,
            None,
            cfg.dedup_window_ms,
            cfg.dedup_grace_ms,
            cfg.timeline_length,
            cfg.fanout_threshold,
            cfg.timeline_slack,
            cfg.dedup_reorder,
        ]

    def process(self, partition: int, records: Iterable[tuple[int, bytes | None]]) -> Applied:
        """Apply ``(offset, value)`` records of one partition, in offset order."""
        out = Applied()
        pipe = self.r.pipeline(transaction=False)
        head = list(self._head)
        head[1] = partition
        args: list = []
        group: list[int | None] = []  # received_time per record of the group (None: quarantined)
        groups: list[list[int | None]] = []
        posts = 0
        for offset, value in records:
            ev = encode(offset, value)
            args += ev
            group.append(ev[4] if ev[1] != "!" else None)
            posts += ev[1] == "post_created"
            out.records += 1
            if len(group) >= self.cfg.group_size or posts >= self.cfg.group_posts:
                pipe.fcall("social_apply", 0, *head, *args)
                groups.append(group)
                args, group, posts = [], [], 0
                if len(groups) >= 8:
                    self._flush(pipe, out, groups)
                    groups = []
        if group:
            pipe.fcall("social_apply", 0, *head, *args)
            groups.append(group)
        self._flush(pipe, out, groups)
        return out

    def _flush(self, pipe, out: Applied, groups: list[list[int | None]]) -> None:
        received: list[int] = []
        for counts, group in zip(pipe.execute(), groups, strict=True):
            out.add(counts)
            # records below the fence come first in a group (offset order): they were applied
            # by an earlier attempt and are not counted again
            received += [rt for rt in group[int(counts[4]) :] if rt is not None]
        if received and self.cfg.record_freshness:
            # received (server clock) -> applied in Redis, in 10 ms buckets: a metric, not state
            now = int(time.time() * 1000)
            hist = Counter(min(max(0, now - rt), FRESHNESS_CAP_MS) // FRESHNESS_BUCKET_MS for rt in received)
            p = self.r.pipeline(transaction=False)
            for bucket, n in hist.items():
                p.hincrby(functions.key(self.cfg.namespace, "freshness"), bucket, n)
            p.execute()
