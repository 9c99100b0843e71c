"""The Redis serving store: the keyed state the speed layer maintains, read by the app API.

The state is written only by the speed layer's Redis functions (:mod:`pipelines.speed`; the key
layout is documented in :mod:`contract.functions`). This module holds the read side the
API serves from (:class:`ServingReader`) and the dumps ``verify`` compares (:class:`ServingStore`).
Every read returns ``as_of``: the fences (partition -> next offset) the state covers, read in
the same pipelined round trip as the data and before it, so the data covers at least ``as_of``.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import cast

import orjson
import redis
import redis.asyncio

from contract import functions
from infra import clients

PAD = 19  # int64 post ids zero-padded: lexicographic order == numeric order for equal scores


def _pid(post_id: int) -> str:
    return str(post_id).zfill(PAD)


def timeline_member(m: str | bytes) -> tuple[int, int]:
    """(post_id, author_id) of a ``tl:<u>`` member: both ids zero-padded, post first."""
    return int(m[:PAD]), int(m[PAD:])


def timeline_member_of(post_id: int, author_id: int) -> str:
    """The ``tl:<u>`` member of a post: its id then its author's, zero-padded (docs/views.md,
    "Identity": a post is (author, post); ties in a timeline are broken by post, then author)."""
    return _pid(post_id) + _pid(author_id)


def _as_of(pairs) -> dict[str, int]:
    """The fence's (partition, next offset) pairs as a read's ``as_of`` (bytes or str replies)."""
    return {str(int(p)): int(o) for p, o in pairs}


def timeline_reply(reply) -> tuple[list[dict], dict[str, int]]:
    """``(posts, as_of)`` of a ``social_timeline`` reply: ``[fence pairs flat, post bodies]``
    (orjson: 50 bodies per read, the stdlib's json.loads was a tenth of the API's CPU per read)."""
    fence, bodies = reply
    return [orjson.loads(b) for b in bodies if b], _as_of(zip(fence[::2], fence[1::2], strict=True))


def connect(url: str) -> redis.Redis:
    """A job's client of the served views (text in and out: infra.clients, the "job" timeout)."""
    return clients.redis_client(url, decode_responses=True)


key = functions.key  # one owner of the key layout: contract.functions


async def _read_loading(client: redis.asyncio.Redis, args: tuple, source) -> list:
    """``FCALL_RO *args``; on a store no speed layer of this version has started on yet (the
    function is not found), load the library (``source()``) once and read again."""
    try:
        return await client.fcall_ro(*args)
    except redis.ResponseError as e:
        if "not found" not in str(e).lower():
            raise
        await client.function_load(source(), replace=True)
        return await client.fcall_ro(*args)


class ServingStore:
    """The write side (the speed layer) and the dumps ``verify`` compares with Delta."""

    def __init__(self, client: redis.Redis, namespace: str):
        self.r = client
        self.ns = namespace

    def k(self, *parts) -> str:
        return key(self.ns, *parts)

    def fences(self) -> dict[int, int]:
        """Partition -> next offset: the log position the keyed state covers."""
        return {int(p): int(o) for p, o in self.r.hgetall(self.k("fence")).items()}

    # -- dumping (verify compares these with the Delta views) ------------------------------------
    def dump_timelines(self, n: int) -> Iterator[tuple[int, int, int]]:
        """(user, author, post) of every stored home timeline's first ``n`` (the rest is slack)."""
        prefix = self.k("tl", "")
        for tl_key in self.r.scan_iter(match=prefix + "*", count=1000):
            u = int(tl_key[len(prefix) :])
            # without scores: the members alone (redis-py types a reply with or without them)
            members = cast(list[bytes | str], self.r.zrevrange(tl_key, 0, n - 1))
            for m in members:
                post, author = timeline_member(m)
                yield u, author, post

    def dump_hash(self, name: str) -> dict[bytes | str, bytes | str]:
        """A hash of the state: str with a client of :func:`connect`, bytes with a bytes one."""
        return self.r.hgetall(self.k(name))


class PartitionedStore:
    """:class:`ServingStore`'s dumps in the partitioned layout: every partition's keys, and each
    home timeline as it is read (``p_timeline``: the fanned-out entries merged with the followed
    celebrities' posts)."""

    def __init__(self, client: redis.Redis, namespace: str, partitions: int):
        self.r = client
        self.ns = namespace
        self.partitions = partitions

    def fences(self) -> dict[int, int]:
        """The log position the state covers: its own fences, when every delivery caused below
        them is applied too; empty otherwise (between a micro-batch's calls and its deliveries)."""
        own, complete = functions.partitioned_state(self.r, self.ns, self.partitions)
        return own if complete else {}

    def dump_timelines(self, n: int) -> Iterator[tuple[int, int, int]]:
        """(user, author, post) of the first ``n`` of every home timeline that has a post: of each
        user with a fanned-out timeline or a followee."""
        for u, post in self.timeline_posts(n):
            yield u, post["author_id"], post["post_id"]

    def timeline_posts(self, n: int) -> Iterator[tuple[int, dict]]:
        """(user, post body) of the first ``n`` of every home timeline, as :meth:`dump_timelines`."""
        for p in range(self.partitions):
            users: set[int] = set()
            for name in ("tl", "following"):
                prefix = functions.pkey(self.ns, p, name, "")
                users |= {int(k[len(prefix) :]) for k in self.r.scan_iter(match=prefix + "*", count=1000)}
            order = sorted(users)
            for i in range(0, len(order), 500):
                pipe = self.r.pipeline(transaction=False)
                for u in order[i : i + 500]:
                    pipe.fcall_ro("p_timeline", 1, functions.pkey(self.ns, p, "fence"), self.ns, p, u, n)
                for u, (_cut, bodies) in zip(order[i : i + 500], pipe.execute(), strict=True):
                    for b in bodies:
                        if b:
                            yield u, orjson.loads(b)

    def dump_hash(self, name: str) -> dict[bytes | str, bytes | str]:
        out: dict[bytes | str, bytes | str] = {}
        for p in range(self.partitions):
            out.update(self.r.hgetall(functions.pkey(self.ns, p, name)))
        return out


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

    def key_for(self, user_id: int, *parts) -> str:
        """The key ``parts`` that holds ``user_id``'s data (one keyspace in this layout)."""
        return key(self.ns, *parts)

    timeline_reply = staticmethod(timeline_reply)

    async def _with_as_of(self, *commands: tuple) -> tuple[dict[str, int], list]:
        """Run ``(command, *args)`` tuples in one pipelined round trip, after reading ``as_of``."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hgetall(self.k("fence"))
        for name, *args in commands:
            getattr(pipe, name)(*args)
        fence, *results = await pipe.execute()
        return _as_of(fence.items()), results

    async def timeline(self, user_id: int, limit: int = 50) -> tuple[list[dict], dict[str, int]]:
        """Home timeline of u: fanned-out entries merged with followed high-fan-out authors.

        One ``FCALL_RO social_timeline`` (the library's read-time half of the hybrid fan-out): the
        merge, the bodies and the fence in one atomic step inside Redis, so a read costs one
        command to encode and one reply to parse however many celebrities u follows.
        """
        return timeline_reply(
            await _read_loading(self.r, self.timeline_args(user_id, limit), functions.source)
        )

    def timeline_args(self, user_id: int, limit: int) -> tuple:
        """``fcall_ro``'s arguments of :meth:`timeline`, for a caller that pipelines the read
        (the API's GET /v1/timeline, app_sim/api/fastpath.py); :func:`timeline_reply` reads the reply."""
        return ("social_timeline", 0, self.ns, user_id, limit)

    async def inbox(self, user_id: int, limit: int = 50) -> tuple[list[dict], dict[str, int]]:
        as_of, (ids,) = await self._with_as_of(("zrevrange", self.k("inbox", user_id), 0, limit - 1))
        bodies = await self.r.hmget(self.k("msgs", user_id), [str(int(m)) for m in ids]) if ids else []
        return [orjson.loads(b) for b in bodies if b], as_of

    async def unread(self, user_id: int) -> tuple[int, dict[str, int]]:
        as_of, (n,) = await self._with_as_of(("hget", self.k("unread"), user_id))
        return int(n or 0), as_of

    async def status(self, user_id: int) -> tuple[dict | None, dict[str, int]]:
        as_of, (raw,) = await self._with_as_of(("hget", self.k("status"), user_id))
        return (orjson.loads(raw) if raw else None), as_of


class PartitionedReader:
    """The read model in the partitioned layout (docs/architecture.md, "The partitioned layout"):
    a user's views are in the keys of the partition that owns the user (``partition_of(user)``),
    each read one round trip to that partition's slot. ``as_of`` is the cut the data covers: the
    owning partition's fence, and each other partition's offset below which its deliveries are in.
    """

    def __init__(self, client: redis.asyncio.Redis, namespace: str, partition_of):
        self.r = client
        self.ns = namespace
        self.partition_of = partition_of

    def k(self, partition: int, *parts) -> str:
        return functions.pkey(self.ns, partition, *parts)

    def key_for(self, user_id: int, *parts) -> str:
        """The key ``parts`` that holds ``user_id``'s data: in the partition that owns the user."""
        return functions.pkey(self.ns, self.partition_of(user_id), *parts)

    def timeline_args(self, user_id: int, limit: int) -> tuple:
        """``fcall_ro``'s arguments of :meth:`timeline` (for a caller that pipelines the read)."""
        p = self.partition_of(user_id)
        return ("p_timeline", 1, self.k(p, "fence"), self.ns, p, user_id, limit)

    def timeline_reply(self, reply) -> tuple[list[dict], dict[str, int]]:
        """``(posts, as_of)`` of a ``p_timeline`` reply: ``[[fence, dfence pairs], bodies]``;
        ``as_of`` names the owner partition's fence (the first entry of the cut)."""
        cut, bodies = reply
        return [orjson.loads(b) for b in bodies if b], self._as_of_cut(cut)

    @staticmethod
    def _as_of(partition: int, cut) -> dict[str, int]:
        fence, dfence = cut
        out = {str(int(s)): int(o) for s, o in zip(dfence[::2], dfence[1::2], strict=True)}
        # the owner's own log: its fence, lowered to where its own deliveries (its posts' fan-out) are
        out[str(partition)] = min(int(fence), out.get(str(partition), 0))
        return dict(sorted(out.items(), key=lambda kv: int(kv[0])))

    def _as_of_cut(self, cut) -> dict[str, int]:
        fence, dfence, partition = cut
        return self._as_of(int(partition), [fence, dfence])

    async def _cut_and(self, partition: int, *commands: tuple) -> tuple[dict[str, int], list]:
        """The partition's cut (``p_cut``) and ``commands`` in one round trip; on a store no speed
        layer of this version has started on yet, the library is loaded once and read again."""
        for attempt in (1, 2):
            pipe = self.r.pipeline(transaction=False)
            pipe.fcall_ro("p_cut", 1, self.k(partition, "fence"), self.ns, partition)
            for name, *args in commands:
                getattr(pipe, name)(*args)
            try:
                cut, *results = await pipe.execute()
            except redis.ResponseError as e:
                if attempt == 2 or "not found" not in str(e).lower():
                    raise
                await self.r.function_load(functions.partitioned_source(), replace=True)
                continue
            return self._as_of_cut(cut), results
        raise AssertionError("unreachable")

    async def timeline(self, user_id: int, limit: int = 50) -> tuple[list[dict], dict[str, int]]:
        args = self.timeline_args(user_id, limit)
        return self.timeline_reply(await _read_loading(self.r, args, functions.partitioned_source))

    async def inbox(self, user_id: int, limit: int = 50) -> tuple[list[dict], dict[str, int]]:
        p = self.partition_of(user_id)
        as_of, (ids,) = await self._cut_and(p, ("zrevrange", self.k(p, "inbox", user_id), 0, limit - 1))
        if not ids:
            return [], as_of
        mids = [str(int(m)) for m in ids]
        # each message's body and, beside it, its read state (field "<message>:r")
        got = await self.r.hmget(self.k(p, "msgs", user_id), [f for m in mids for f in (m, f"{m}:r")])
        out = []
        for body, read in zip(got[::2], got[1::2], strict=True):
            if body:
                out.append({**orjson.loads(body), "read": read is not None})
        return out, as_of

    async def unread(self, user_id: int) -> tuple[int, dict[str, int]]:
        p = self.partition_of(user_id)
        as_of, (n,) = await self._cut_and(p, ("hget", self.k(p, "unread"), user_id))
        return int(n or 0), as_of

    async def status(self, user_id: int) -> tuple[dict | None, dict[str, int]]:
        p = self.partition_of(user_id)
        as_of, (raw,) = await self._cut_and(p, ("hget", self.k(p, "status"), user_id))
        return (orjson.loads(raw) if raw else None), as_of


def partition_of(user_id: int, partitions: int) -> int:
    """The Kafka partition of the events keyed by ``user_id`` (``contract.record_key``: the id as
    decimal bytes) under librdkafka's default partitioner, which every producer of the project uses
    (``consistent_random``: CRC-32 of the key, modulo the partitions)."""
    return zlib.crc32(str(user_id).encode()) % partitions


def reader(client: redis.asyncio.Redis, namespace: str, layout: str = "keyed", partitions: int = 0):
    """The read model of ``layout`` (``SOCIAL_SERVING_LAYOUT``): :class:`ServingReader` or
    :class:`PartitionedReader` over ``partitions`` (the event topic's)."""
    if layout == "partitioned":
        return PartitionedReader(client, namespace, lambda u: partition_of(int(u), partitions))
    return ServingReader(client, namespace)
