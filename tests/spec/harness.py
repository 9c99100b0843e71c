"""The property test's harness: runs the real implementations over a :class:`tests.spec.logs.Log`
and reads their views in the one shape the specification (:mod:`tests.spec.views`) gives them.

Not part of the specification: this module uses the project's code (the processor, the serving
reader, the key layout) to run and read (a) the speed layer and (b) the replay; (c) the batch
layer's DataFrames are collected into the same shape here too.
"""

from __future__ import annotations

import asyncio
import json

import redis
import redis.asyncio

from tests.spec import views as spec
from tests.spec.logs import GRACE_MS, REORDER, WINDOW_MS, Log

DISPOSITION = {"a": spec.APPLIED, "d": spec.DUPLICATE, "r": spec.REJECTED, "q": spec.QUARANTINED}
ACCOUNTING = ("applied", "duplicates", "rejected", "quarantined")


def expected(log: Log, n: int, upto: dict[int, int] | None = None) -> spec.Outcome:
    """The specification over the log (or its prefix: partition -> records applied)."""
    per_p = log.per_partition()
    if upto is not None:
        per_p = {p: vs[: upto.get(p, 0)] for p, vs in per_p.items()}
    return spec.evaluate(per_p, n, WINDOW_MS, GRACE_MS, REORDER)


def expected_under(cfg, per_partition: dict[int, list[bytes | None]]) -> spec.Outcome:
    """The specification over records (partition -> values in offset order) with the timeline length
    and dedup rules of ``cfg`` (a Settings or a ProcessorConfig: the ones the run was made with)."""
    return spec.evaluate(
        per_partition, cfg.timeline_length, cfg.dedup_window_ms, cfg.dedup_grace_ms, cfg.dedup_reorder
    )


def spec_views(out: spec.Outcome, users: list[int]) -> dict:
    """The views users read, from the specification."""
    return {
        "timeline": {u: out.timeline(u) for u in users},
        "inbox": {u: dict(out.inbox.get(u, {})) for u in users},
        "unread": {u: out.unread(u) for u in users},
        "status": {u: out.status.get(u) for u in users},
        "follows": {u: set(out.follows.get(u, set())) for u in users},
        "users": {u: out.users.get(u) for u in users},
    }


# ------------------------------------------------------------------------------------------------
# (a) and (b): the keyed state in Redis, read as the API reads it
# ------------------------------------------------------------------------------------------------
def redis_views(url: str, ns: str, users: list[int], n: int) -> dict:
    from contract.serving import ServingReader

    async def read() -> dict:
        client = redis.asyncio.Redis.from_url(url)
        try:
            reader = ServingReader(client, ns)
            out: dict = {k: {} for k in ("timeline", "inbox", "unread", "status", "follows", "users")}
            for u in users:
                out["timeline"][u] = (await reader.timeline(u, n))[0]
                box = (await reader.inbox(u, 10_000))[0]
                out["inbox"][u] = {m["message_id"]: m for m in box}
                out["unread"][u] = (await reader.unread(u))[0]
                out["status"][u] = (await reader.status(u))[0]
                out["follows"][u] = {int(f) for f in await client.smembers(f"{ns}:following:{u}")}
                raw = await client.hget(f"{ns}:users", u)
                out["users"][u] = json.loads(raw) if raw else None
            return out
        finally:
            await client.aclose()

    return asyncio.run(read())


def redis_dispositions(
    client: redis.Redis, ns: str, partitions
) -> dict[tuple[int, int], tuple[str, str | None]]:
    out = {}
    for p in partitions:
        for entry_id, fields in client.xrange(f"{ns}:changelog:{p}"):
            entry_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
            f = {
                (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
                for k, v in fields.items()
            }
            out[p, int(entry_id.split("-")[0])] = (DISPOSITION[f["d"]], f.get("r") or None)
    return out


def redis_accounting(client: redis.Redis, ns: str, partitions) -> dict[str, int]:
    from contract import functions

    totals = functions.accounting(client, ns, list(partitions))
    return {k: totals.get(k, 0) for k in ACCOUNTING}


# ------------------------------------------------------------------------------------------------
# Comparing
# ------------------------------------------------------------------------------------------------
def diff_views(want: dict, got: dict, label: str = "") -> list[str]:
    out = []
    for view, per_user in want.items():
        for u, w in per_user.items():
            g = got[view].get(u)
            if view == "inbox":
                w, g = w or {}, g or {}
            if w != g:
                out.append(f"{label}{view}({u}): spec {w!r} != impl {g!r}")
    return out


def diff_dispositions(want: dict, got: dict, label: str = "") -> list[str]:
    out = []
    for k in sorted(set(want) | set(got)):
        if want.get(k) != got.get(k):
            out.append(f"{label}record {k}: spec {want.get(k)} != impl {got.get(k)}")
    return out


def diff_accounting(want: dict, got: dict, label: str = "") -> list[str]:
    return [] if want == got else [f"{label}accounting: spec {want} != impl {got}"]


# ------------------------------------------------------------------------------------------------
# (a) in the partitioned layout: the same views, read from the partition that owns each user
# ------------------------------------------------------------------------------------------------
def partitioned_views(url: str, ns: str, users: list[int], n: int, partition_of) -> dict:
    from contract.functions import pkey
    from contract.serving import PartitionedReader
    from infra import clients

    async def read() -> dict:
        client = clients.redis_client(url, asyncio=True)  # a Redis Cluster's when url names one
        try:
            reader = PartitionedReader(client, ns, partition_of)
            out: dict = {k: {} for k in ("timeline", "inbox", "unread", "status", "follows", "users")}
            for u in users:
                p = partition_of(u)
                out["timeline"][u] = (await reader.timeline(u, n))[0]
                box = (await reader.inbox(u, 10_000))[0]
                out["inbox"][u] = {m["message_id"]: m for m in box}
                out["unread"][u] = (await reader.unread(u))[0]
                out["status"][u] = (await reader.status(u))[0]
                out["follows"][u] = {int(f) for f in await client.smembers(pkey(ns, p, "following", u))}
                raw = await client.hget(pkey(ns, p, "users"), u)
                out["users"][u] = json.loads(raw) if raw else None
            return out
        finally:
            await client.aclose()

    return asyncio.run(read())


def partitioned_dispositions(client: redis.Redis, ns: str, partitions) -> dict:
    """Every record's disposition from the changelogs (an event's entry is ``<offset + 1>-0``; a
    delivery's entries, disposition ``x``, are not records of the partition)."""
    from contract.functions import pkey

    out = {}
    for p in partitions:
        for entry_id, fields in client.xrange(pkey(ns, p, "changelog")):
            entry_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
            f = {
                (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
                for k, v in fields.items()
            }
            if f["d"] == "x":
                continue
            ms, seq = entry_id.split("-")
            assert seq == "0", f"partition {p}: event entry {entry_id} is not <offset + 1>-0"
            out[p, int(ms) - 1] = (DISPOSITION[f["d"]], f.get("r") or None)
    return out


def partitioned_accounting(client: redis.Redis, ns: str, partitions) -> dict[str, int]:
    from contract.functions import pkey

    totals = dict.fromkeys(ACCOUNTING, 0)
    for p in partitions:
        for name, v in client.hgetall(pkey(ns, p, "stats")).items():
            name = name.decode() if isinstance(name, bytes) else name
            if name in totals:
                totals[name] += int(v)
    return totals


def partitioned_archive(
    client: redis.Redis, ns: str, partitions, position: dict[int, int]
) -> tuple[spec.Outcome, dict[int, int]]:
    """What the archive holds at a settled ``position``, read as the archiver's rule says
    (pipelines/speed/changelog.py): every changelog entry whose cause is below the position (an
    event below its partition's offset, a delivery whose source offset is below its source's), and
    each view's row the last change of its key in its partition's changelog order. Written here
    from the changelog's documented format, not with the compaction's code. Returns the facts and
    ``unread_counts`` (the N rows)."""
    from contract.functions import pkey

    def text(v):
        return v.decode() if isinstance(v, bytes) else v

    out = spec.Outcome(n=0)
    follows: dict[tuple[int, int], bool] = {}
    unread: dict[int, int] = {}
    for p in partitions:
        for entry_id, fields in client.xrange(pkey(ns, p, "changelog")):
            f = {text(k): text(v) for k, v in fields.items()}
            if f["d"] == "x":
                src, offset = (int(x) for x in f["src"].split(":"))
            else:
                src, offset = p, int(text(entry_id).split("-")[0]) - 1
            if offset >= position.get(src, 0) or "c" not in f:
                continue
            for ch in json.loads(f["c"]):
                kind, k = ch[0], ch[1:]
                if kind == "U":
                    out.users[int(k[0])] = {"handle": k[1], "display_name": k[2]}
                elif kind == "U-":
                    out.users.pop(int(k[0]), None)
                elif kind == "S":
                    out.status[int(k[0])] = {"text": k[1], "event_time": int(k[2])}
                elif kind == "S-":
                    out.status.pop(int(k[0]), None)
                elif kind in ("F+", "F-"):
                    follows[int(k[0]), int(k[1])] = kind == "F+"
                elif kind == "P":
                    out.posts[int(k[0]), int(k[1])] = {
                        "text": k[3],
                        "event_time": int(k[2]),
                        "deleted": int(k[4]) == 1,
                    }
                elif kind == "P-":
                    out.posts.pop((int(k[0]), int(k[1])), None)
                elif kind == "I":
                    r, m = int(k[0]), int(k[1])
                    out.inbox.setdefault(r, {})[m] = {
                        "message_id": m, "sender_id": int(k[2]), "text": k[3], "event_time": int(k[4]),
                        "read": int(k[5]) == 1,
                    }  # fmt: skip
                elif kind == "I-":
                    out.inbox.get(int(k[0]), {}).pop(int(k[1]), None)
                elif kind == "N":
                    unread[int(k[0])] = int(k[1])
                elif kind == "N-":
                    unread.pop(int(k[0]), None)
    for (u, f), on in follows.items():
        if on:
            out.follows.setdefault(u, set()).add(f)
    out.inbox = {r: box for r, box in out.inbox.items() if box}
    return out, unread


def diff_archive(
    want: spec.Outcome, got: spec.Outcome, got_unread: dict[int, int], label: str = ""
) -> list[str]:
    """The archive's facts against the specification's, view by view."""
    out = []
    for view in ("users", "status", "follows", "posts", "inbox"):
        w, g = getattr(want, view), getattr(got, view)
        for k in sorted(set(w) | set(g), key=repr):
            if w.get(k) != g.get(k):
                out.append(f"{label}archive {view}[{k}]: spec {w.get(k)!r} != archive {g.get(k)!r}")
    unread = {r: n for r in want.inbox if (n := want.unread(r))}
    got_unread = {u: n for u, n in got_unread.items() if n}
    if unread != got_unread:
        out.append(f"{label}archive unread_counts: spec {unread} != archive {got_unread}")
    return out
