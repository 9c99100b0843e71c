"""The keyed processor in the partitioned layout: one partition's records -> its own state, then
its deliveries to every other partition (docs/architecture.md, "The partitioned layout").

Two calls, each over the keys of one Kafka partition (one Redis Cluster slot):

- ``p_apply`` (:meth:`PartitionedProcessor.process`): a partition's records, in offset order,
  applied to the state that partition owns, each with its changelog entry and at most one outbox
  entry (a post, a delete or an erasure that other partitions' followers and inboxes see);
- ``p_deliver`` (:meth:`PartitionedProcessor.deliver`): a source partition's outbox entries below
  its fence, applied by a target partition, fenced per (target, source): a delivery applied twice
  changes nothing, so a crash between the source's call and its deliveries loses nothing (the
  outbox stays until every target's fence has passed it).

The arguments of both follow ``contract/redis_functions/protocol.json`` by name.

On a Redis Cluster (``SOCIAL_REDIS_URL`` names a node: :func:`infra.clients.redis_client` gives a
cluster client) each call goes to the master that owns its partition's slot, found from the one
key it names, and a pipeline of many partitions' calls is redis-py's cluster pipeline, which sends
each master its commands and gives the replies back in order. A call redis-py sends again (after a
MOVED, an ASK or a TRYAGAIN) is skipped by its fence (docs/architecture.md, "On Redis Cluster").

A lost connection stops the processor loudly instead (its client never resends,
:func:`infra.clients.redis_client`'s ``resend``): a master that restarts from its append-only file
may come back without its last second of writes, its fences rolled back with its state, and only a
processor started afresh from the fences (the stream's start) re-applies what it lost. Two checks
keep a processor that kept running from going on past such a loss: :meth:`PartitionedProcessor.process`
reads the partition's fence before its calls and refuses records that start above it
(:class:`FenceBehind`), and on a cluster an outbox entry is trimmed only once every target has
held it for :data:`OUTBOX_DURABILITY_S` (a target on another master may lose its deliveries).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass

import redis

import contract
from contract import functions
from infra import clients
from pipelines.speed.processor import FRESHNESS_BUCKET_MS, FRESHNESS_CAP_MS, Applied, ProcessorConfig

PROTOCOL = functions.protocol()
_RECEIVED = PROTOCOL["event"].index("received_time")
# protocol names -> the event's field (the rest have the same name in the event)
_FROM_EVENT = {"followee": "followee_id", "user": "user_id"}
# Redis fsyncs its append-only file every second and may come back from a crash without its last
# ~2 s (SOCIAL_ARCHIVE_DURABILITY_S waits as long for the same reason). On a cluster each master
# rolls back on its own: a target's deliveries newer than this may be lost while the source's
# master kept its trim, so an outbox keeps what every target applied for this long.
OUTBOX_DURABILITY_S = 2.0


class FenceBehind(RuntimeError):
    """A partition's fence is below the first record it is given: Redis lost writes the processor
    made (a master restarted from an append-only file without its last second), and records
    between the two were never applied."""


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else v


def encode(offset: int, value: bytes | None) -> list:
    """One record as ``p_apply``'s arguments: the ``event`` fields and its type's, by name
    (``quarantined`` for a record the contract rejects)."""
    reason = None
    event = None
    if value is None:
        reason = "bad_json"
    else:
        try:
            event, reason = contract.parse_and_validate(value)
        except Exception as exc:  # a bug in the contract code must not stop the stream either
            event, reason = None, f"processing_error:{type(exc).__name__}"
    # parse_and_validate gives an event or a reason, never both
    if event is not None and event["type"] not in PROTOCOL["events"]:
        event, reason = None, "unknown_type"
    if event is None:
        return [{"offset": offset, "type": "!", "reason": reason}[n] for n in PROTOCOL["quarantined"]]
    e = dict(event)
    e["offset"] = offset
    e["event_time"] = e["device_time"] + (e["received_time"] - e["sent_time"])
    if e["type"] == "message_sent":  # keyed by the recipient: the inbox's owner is the "user"
        e["sender"], e["user_id"] = e["user_id"], e["recipient_id"]
    names = PROTOCOL["event"] + PROTOCOL["events"][e["type"]]
    return [e[_FROM_EVENT.get(n, n)] for n in names]


@dataclass
class Delivered:
    """What :meth:`PartitionedProcessor.deliver` did."""

    applied: int = 0
    skipped: int = 0
    quarantined: int = 0
    calls: int = 0


class PartitionedProcessor:
    """Applies records and their deliveries through ``partitioned.lua``."""

    def __init__(self, cfg: ProcessorConfig, partitions: int, client: redis.Redis | None = None):
        self.cfg = cfg
        self.partitions = partitions
        self.r = client or clients.redis_client(cfg.redis_url, resend=False)
        functions.ensure_partitioned_loaded(self.r)
        # per source: (when, offset below which every target had its deliveries), newest last;
        # the outbox is trimmed to the newest one at least `_outbox_kept_s` old (a single Redis
        # rolls back whole, its outboxes with its targets: trimmed at once)
        self._outbox_kept_s = OUTBOX_DURABILITY_S if isinstance(self.r, redis.RedisCluster) else 0.0
        self._everywhere: dict[int, deque[tuple[float, int]]] = {}
        self._trimmed: dict[int, int] = {}
        # receive times of the records applied and not yet delivered everywhere, per partition:
        # :meth:`pump` records them in the freshness histogram once their deliveries are in
        self._received: dict[int, list[int]] = {}
        self._header = {
            "namespace": cfg.namespace,
            "dedup_window_ms": cfg.dedup_window_ms,
            "dedup_grace_ms": cfg.dedup_grace_ms,
            "timeline_n": cfg.timeline_length,
            "fanout_threshold": cfg.fanout_threshold,
            "timeline_slack": cfg.timeline_slack,
            "dedup_reorder": cfg.dedup_reorder,
        }

    def k(self, partition: int, *parts) -> str:
        return functions.pkey(self.cfg.namespace, partition, *parts)

    def _head(self, call: str, **values) -> list:
        named = {**self._header, **values}
        return [named[n] for n in PROTOCOL[call]]

    def process(self, partition: int, records: Iterable[tuple[int, bytes | None]]) -> Applied:
        """Apply ``(offset, value)`` records of one partition, in offset order (its deliveries are
        left in its outbox for :meth:`deliver`).

        Raises :class:`FenceBehind` if the partition's fence is below the first record: the records
        between were never applied (the fence, read just before the calls, is that of a Redis that
        lost writes). A partition with no fence yet starts at its first record (a log whose
        earliest offsets are gone)."""
        out = Applied()
        head = self._head("apply", partition=partition)
        fence = self.k(partition, "fence")
        pipe = self.r.pipeline(transaction=False)
        args: list = []
        n = posts = 0
        groups: list[list[int | None]] = []  # each call's records' receive times (None: quarantined)
        group: list[int | None] = []
        first = None
        for offset, value in records:
            if first is None:
                first = offset
            ev = encode(offset, value)
            args += ev
            n += 1
            posts += ev[1] == "post_created"
            group.append(int(ev[_RECEIVED]) if ev[1] != "!" else None)
            out.records += 1
            if n >= self.cfg.group_size or posts >= self.cfg.group_posts:
                pipe.fcall("p_apply", 1, fence, *head, *args)
                args, n, posts = [], 0, 0
                groups.append(group)
                group = []
        if n:
            pipe.fcall("p_apply", 1, fence, *head, *args)
            groups.append(group)
        if groups:
            have = self.r.get(fence)
            if have is not None and int(have) < int(first or 0):
                raise FenceBehind(
                    f"partition {partition}: the fence in Redis is {int(have)}, the records start at "
                    f"{first}: Redis lost writes (a master restarted without its last second?). "
                    "Restart the speed layer: it starts from the fences."
                )
            received = self._received.setdefault(partition, [])
            for counts, times in zip(pipe.execute(), groups, strict=True):
                out.add(counts)
                # records below the fence come first in a call (offset order): an earlier
                # attempt applied them, and they are not counted again
                received += [t for t in times[int(counts[4]) :] if t is not None]
        return out

    def deliver(self, source: int, target: int, limit: int | None = None, replay: int = 0) -> Delivered:
        """Apply ``source``'s outbox entries that ``target`` has not applied (at most ``limit``;
        ``replay``: also that many before its fence again, which the fence skips)."""
        done = Delivered()
        pipe = self.r.pipeline(transaction=False)
        pipe.get(self.k(source, "fence"))
        pipe.hget(self.k(target, "dfence"), source)
        upto, covered = (int(v or 0) for v in pipe.execute())
        if covered >= upto:
            return done
        entries = self._outbox(source, covered, upto)
        if replay:
            entries = self._outbox(source, 0, covered)[-replay:] + entries
        if limit is not None and len(entries) > limit:
            entries = entries[:limit]
            upto = entries[-1][0] + 1 if entries else covered
        a, s, q = self.r.fcall(
            "p_deliver",
            1,
            self.k(target, "fence"),
            *self._head("deliver", partition=target),
            *self._segment(source, upto, entries),
        )
        done.applied, done.skipped, done.quarantined, done.calls = int(a), int(s), int(q), 1
        return done

    @staticmethod
    def _segment(source: int, upto: int, entries: list[tuple[int, str, list[str]]]) -> list:
        seg = {"source": source, "upto": upto, "count": len(entries)}
        args: list[int | str] = [seg[n] for n in PROTOCOL["segment"]]
        for offset, kind, values in entries:
            args += [offset, kind, len(values), *values]
        return args

    def _outbox(self, source: int, start: int, end: int) -> list[tuple[int, str, list[str]]]:
        """Outbox entries of offsets ``[start, end)``: (offset, kind, values in protocol order)."""
        if end <= start:
            return []
        out = []
        entries = functions.stream_range(self.r, self.k(source, "out"), min=f"{start}-0", max=f"{end - 1}-1")
        for entry_id, fields in entries:
            f = {_text(k): _text(v) for k, v in fields.items()}
            kind = f.pop("kind")
            names = PROTOCOL["deliveries"].get(kind)
            # a kind this code does not know travels as it is: the target quarantines it with a reason
            values = [f[n] for n in names] if names and set(names) <= set(f) else list(f.values())
            out.append((int(_text(entry_id).split("-")[0]), kind, values))
        return out

    def pump(self, sources: Iterable[int], chunk: int = 4000) -> Delivered:
        """Deliver the outboxes of ``sources`` to every partition (their own included: a post's
        fan-out is a delivery too), each target in one call for all sources (its timelines take a
        whole micro-batch's posts in one insert each), then trim the outboxes: three round trips."""
        total = Delivered()
        sources = sorted(set(sources))
        if not sources:
            return total
        targets = range(self.partitions)
        pipe = self.r.pipeline(transaction=False)
        for s in sources:
            pipe.get(self.k(s, "fence"))
        for q in targets:
            pipe.hmget(self.k(q, "dfence"), sources)
        got = pipe.execute()
        upto = {s: int(v or 0) for s, v in zip(sources, got[: len(sources)], strict=True)}
        covered = {
            q: {s: int(v or 0) for s, v in zip(sources, row, strict=True)}
            for q, row in zip(targets, got[len(sources) :], strict=True)
        }
        low = {s: min(covered[q][s] for q in targets) for s in sources}
        outbox = {s: self._outbox(s, low[s], upto[s]) for s in sources if low[s] < upto[s]}
        pipe = self.r.pipeline(transaction=False)
        calls = 0
        for q in targets:
            args: list = []
            size = 0
            for s in outbox:
                if covered[q][s] >= upto[s]:
                    continue
                mine = [e for e in outbox[s] if e[0] >= covered[q][s]]
                # a call stays bounded (reads wait behind it): a source's entries split at `chunk`
                for i in range(0, max(len(mine), 1), chunk):
                    part = mine[i : i + chunk]
                    end = upto[s] if i + chunk >= len(mine) else part[-1][0] + 1
                    if size and size + len(part) > chunk:
                        pipe.fcall(
                            "p_deliver", 1, self.k(q, "fence"), *self._head("deliver", partition=q), *args
                        )
                        calls += 1
                        args, size = [], 0
                    args += self._segment(s, end, part)
                    size += len(part)
            if args:
                pipe.fcall("p_deliver", 1, self.k(q, "fence"), *self._head("deliver", partition=q), *args)
                calls += 1
        if calls:
            for a, sk, qn in pipe.execute():
                total.applied += int(a)
                total.skipped += int(sk)
                total.quarantined += int(qn)
                total.calls += 1
        # every target has applied everything below `upto` now: trimmed once that is durable
        pipe = self.r.pipeline(transaction=False)
        for s, bound in self._durable(upto).items():
            pipe.xtrim(self.k(s, "out"), minid=f"{bound}-0", approximate=False)
        self._record_freshness(pipe, sources)
        pipe.execute()
        return total

    def _durable(self, upto: dict[int, int]) -> dict[int, int]:
        """Source -> the offset to trim its outbox to: what every target had applied at least
        ``_outbox_kept_s`` ago (now, on a single Redis), where that is past the last trim."""
        now = time.monotonic()
        out = {}
        for s, u in upto.items():
            seen = self._everywhere.setdefault(s, deque())
            seen.append((now, u))
            bound = None
            while seen and now - seen[0][0] >= self._outbox_kept_s:
                bound = seen.popleft()[1]
            if bound is not None:
                seen.appendleft((now - self._outbox_kept_s, bound))  # kept: the newest durable bound
                if bound > self._trimmed.get(s, 0):
                    out[s] = self._trimmed[s] = bound
        return out

    def _record_freshness(self, pipe, sources: list[int]) -> None:
        """Received (server clock) -> visible in every partition, in 10 ms buckets, per source
        partition (``{<p>}:freshness``): a metric, not state."""
        if not self.cfg.record_freshness:
            self._received.clear()
            return
        now = int(time.time() * 1000)
        for s in sources:
            received = self._received.pop(s, [])
            hist = Counter(min(max(0, now - rt), FRESHNESS_CAP_MS) // FRESHNESS_BUCKET_MS for rt in received)
            for bucket, n in hist.items():
                pipe.hincrby(self.k(s, "freshness"), bucket, n)

    def fences(self) -> dict[int, int]:
        """Partition -> next offset to apply (each partition's own fence)."""
        pipe = self.r.pipeline(transaction=False)
        for p in range(self.partitions):
            pipe.get(self.k(p, "fence"))
        return {p: int(v or 0) for p, v in enumerate(pipe.execute())}

    def delivered(self) -> dict[int, int]:
        """Source partition -> the offset below which every partition has its deliveries."""
        pipe = self.r.pipeline(transaction=False)
        for q in range(self.partitions):
            pipe.hgetall(self.k(q, "dfence"))
        low: dict[int, int] = {}
        for raw in pipe.execute():
            got = {int(s): int(o) for s, o in raw.items()}
            for s in range(self.partitions):
                low[s] = min(low.get(s, got.get(s, 0)), got.get(s, 0))
        return low

    def settle(self) -> None:
        """Deliver every outbox entry to every partition (a quiet log's state at its fences)."""
        self.pump(range(self.partitions))
