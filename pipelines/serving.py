"""The Redis serving store: written by the speed layer, read by the app API.

Writes are the fold's output for one batch (``BatchOutput``) applied as idempotent commands
(ZADD/ZREM/SADD/SREM/HSET of absolute values, never INCR), so re-applying a batch after a crash
changes nothing; the ``meta`` hash, written last, records the batch id and the log position
(per-partition end offsets) the store covers: reads return it as ``as_of``.

Keys, all under ``<namespace>:`` (one namespace per views version, for blue/green switching):

==================  ======  =====================================================================
``tl:<u>``          zset    fanned-out home timeline of u: member = post_id (zero-padded), score
                            = corrected event time; equals the Delta ``home_timeline`` rows of u
``posts:<a>``       zset    author a's live posts (read-time merge of high-fan-out authors)
``p:<post_id>``     string  JSON of a live post
``following:<u>``   set     follows(u)
``celebs``          set     authors over the fan-out threshold
``inbox:<u>``       zset    message ids of inbox(u) by event time; ``msgs:<u>`` hash id -> JSON
``unread``          hash    u -> unread(u)
``status``          hash    u -> JSON {text, event_time}
``users``           hash    u -> JSON {handle, display_name}
``meta``            hash    batch_id, offsets (JSON partition -> end offset), updated_at
==================  ======  =====================================================================
"""

from __future__ import annotations

import heapq
import json
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import redis
import redis.asyncio

if TYPE_CHECKING:  # the API reads through this module and never needs Spark
    from pipelines.views import BatchOutput

PAD = 19  # int64 post ids zero-padded: lexicographic order == numeric order for equal scores


def _pid(post_id: int) -> str:
    return str(post_id).zfill(PAD)


def connect(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True, socket_timeout=30)


def _rows(df, *cols) -> Iterator[tuple]:
    """Stream a DataFrame's columns to the driver through Arrow (no per-row Row objects)."""
    table = df.select(*cols).toArrow()
    columns = [table.column(c).to_pylist() for c in cols]
    return zip(*columns, strict=True)


def key(namespace: str, *parts) -> str:
    return ":".join([namespace, *map(str, parts)])


class ServingStore:
    """The write side (the speed layer) and the dumps ``verify`` compares with Delta."""

    def __init__(self, client: redis.Redis, namespace: str, chunk: int = 5000):
        self.r = client
        self.ns = namespace
        self.chunk = chunk

    def k(self, *parts) -> str:
        return key(self.ns, *parts)

    # -- writing -------------------------------------------------------------------------------
    def applied_batch(self) -> int:
        v = self.r.hget(self.k("meta"), "batch_id")
        return int(v) if v is not None else -1

    def _pipelined(self, commands: Iterable[tuple]) -> int:
        """Send ``(command, *args)`` tuples in pipelined chunks; returns how many were sent."""
        n = 0
        pipe = self.r.pipeline(transaction=False)
        for name, *args in commands:
            getattr(pipe, name)(*args)
            n += 1
            if n % self.chunk == 0:
                pipe.execute()
        pipe.execute()
        return n

    def _commands(self, out: BatchOutput) -> Iterator[tuple]:
        """The batch as idempotent Redis commands (absolute values only)."""
        k = self.k
        inserts: dict[int, dict[str, int]] = defaultdict(dict)  # one ZADD per timeline, not per row
        for u, pid, t in _rows(out.timeline_inserts, "user_id", "post_id", "event_time"):
            inserts[u][_pid(pid)] = t
        for u, members in inserts.items():
            yield "zadd", k("tl", u), members
        deletes: dict[int, list[str]] = defaultdict(list)
        for u, pid in _rows(out.timeline_deletes, "user_id", "post_id"):
            deletes[u].append(_pid(pid))
        for u, members in deletes.items():
            yield "zrem", k("tl", u), *members
        for a, pid, t, text, deleted in _rows(
            out.posts, "author_id", "post_id", "event_time", "text", "deleted"
        ):
            if deleted:
                yield "zrem", k("posts", a), _pid(pid)
                yield "delete", k("p", pid)
            else:
                yield "zadd", k("posts", a), {_pid(pid): t}
                yield (
                    "set",
                    k("p", pid),
                    json.dumps({"post_id": pid, "author_id": a, "text": text, "event_time": t}),
                )
        for u, f in _rows(out.follows_upserts, "user_id", "followee_id"):
            yield "sadd", k("following", u), f
        for u, f in _rows(out.follows_deletes, "user_id", "followee_id"):
            yield "srem", k("following", u), f
        for a, celebrity in _rows(out.celebrities, "author_id", "celebrity"):
            yield ("sadd" if celebrity else "srem"), k("celebs"), a
        for u, mid, sender, text, t, read in _rows(
            out.inbox, "recipient_id", "message_id", "sender_id", "text", "event_time", "read"
        ):
            yield "zadd", k("inbox", u), {_pid(mid): t}
            body = {"message_id": mid, "sender_id": sender, "text": text, "event_time": t, "read": read}
            yield "hset", k("msgs", u), mid, json.dumps(body)
        for u, n in _rows(out.unread_counts, "user_id", "unread"):
            yield "hset", k("unread"), u, n
        for u, text, t in _rows(out.user_status, "user_id", "text", "event_time"):
            yield "hset", k("status"), u, json.dumps({"text": text, "event_time": t})
        for u, handle, name in _rows(out.users, "user_id", "handle", "display_name"):
            yield "hset", k("users"), u, json.dumps({"handle": handle, "display_name": name})

    def apply(self, batch_id: int, out: BatchOutput, end_offsets: dict[int, int]) -> int:
        """Apply batch ``batch_id`` unless the store already covers it; returns commands sent."""
        if self.applied_batch() >= batch_id:
            return 0
        sent = self._pipelined(self._commands(out))
        # Written last: readers see the new position only once everything it covers is there.
        self.r.hset(
            self.k("meta"),
            mapping={
                "batch_id": batch_id,
                "offsets": json.dumps(end_offsets),
                "updated_at": int(time.time() * 1000),
            },
        )
        return sent

    # -- dumping (verify compares these with the Delta views) ------------------------------------
    def dump_timelines(self) -> Iterator[tuple[int, int]]:
        prefix = self.k("tl", "")
        for tl_key in self.r.scan_iter(match=prefix + "*", count=1000):
            u = int(tl_key[len(prefix) :])
            for m in self.r.zrange(tl_key, 0, -1):
                yield u, int(m)

    def dump_hash(self, name: str) -> dict[str, str]:
        return self.r.hgetall(self.k(name))


class ServingReader:
    """The read model the API serves from (asyncio): timeline, inbox, unread, status of a user.

    Every read returns ``(data, as_of)``: the position the store covers (``meta.offsets``) is read
    first, in the same pipelined round trip as the data, so the data covers at least ``as_of``.
    """

    def __init__(self, client: redis.asyncio.Redis, namespace: str):
        self.r = client
        self.ns = namespace

    def k(self, *parts) -> str:
        return key(self.ns, *parts)

    async def _with_as_of(self, *commands: tuple) -> tuple[dict[str, int], list]:
        """Run ``(command, *args)`` tuples in one pipelined round trip, after reading ``as_of``."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hget(self.k("meta"), "offsets")
        for name, *args in commands:
            getattr(pipe, name)(*args)
        raw, *results = await pipe.execute()
        return (json.loads(raw) if raw else {}), results

    async def timeline(self, user_id: int, limit: int = 50) -> tuple[list[dict], dict[str, int]]:
        """Home timeline of u: fanned-out entries merged with followed high-fan-out authors."""
        as_of, (own, celebs) = await self._with_as_of(
            ("zrevrange", self.k("tl", user_id), 0, limit - 1, True),
            ("sinter", self.k("following", user_id), self.k("celebs")),
        )
        lists = [own]
        if celebs:
            pipe = self.r.pipeline(transaction=False)
            for c in celebs:
                pipe.zrevrange(self.k("posts", c), 0, limit - 1, withscores=True)
            lists += await pipe.execute()
        # newest first by (event time, post id): the same order as the Delta view
        merged = heapq.merge(*lists, key=lambda m: (m[1], m[0]), reverse=True) if celebs else own
        top, seen = [], set()
        for member, _score in merged:
            if member not in seen:
                seen.add(member)
                top.append(member)
            if len(top) == limit:
                break
        bodies = await self.r.mget([self.k("p", int(m)) for m in top]) if top else []
        return [json.loads(b) for b in bodies if b], as_of

    async def inbox(self, user_id: int, limit: int = 50) -> tuple[list[dict], dict[str, int]]:
        as_of, (ids,) = await self._with_as_of(("zrevrange", self.k("inbox", user_id), 0, limit - 1))
        bodies = await self.r.hmget(self.k("msgs", user_id), [str(int(m)) for m in ids]) if ids else []
        return [json.loads(b) for b in bodies if b], as_of

    async def unread(self, user_id: int) -> tuple[int, dict[str, int]]:
        as_of, (n,) = await self._with_as_of(("hget", self.k("unread"), user_id))
        return int(n or 0), as_of

    async def status(self, user_id: int) -> tuple[dict | None, dict[str, int]]:
        as_of, (raw,) = await self._with_as_of(("hget", self.k("status"), user_id))
        return (json.loads(raw) if raw else None), as_of
