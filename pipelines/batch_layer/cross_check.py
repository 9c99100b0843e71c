"""The live keyed state in Redis against the batch views at the same log position P (Lambda check).

Two independent implementations of docs/views.md meet here: the speed layer's Redis functions
(event by event, in offset order) and the batch layer's set functions
(:mod:`pipelines.batch_layer.definition`). Each view is read from Redis (either layout: key names
in :mod:`contract.functions`) into rows ``key columns + value columns`` and joined with the
batch view on its key; a disagreement names the view, the key and both values.

Redis is only compared when its fences equal P before and after it is read (a running stream
that moved on makes the result ``skipped``, never a false mismatch).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

import pyarrow as pa
import pyarrow.parquet as pq
import redis
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from contract import functions
from contract.serving import timeline_member
from pipelines.batch_layer.definition import BatchConfig, BatchViews, home_timeline_view

EXAMPLES = 5
LETTER = {"a": "applied", "d": "duplicate", "r": "rejected", "q": "quarantined"}


@dataclass(frozen=True)
class View:
    name: str
    keys: tuple[str, ...]
    values: tuple[str, ...]
    schema: str  # Spark DDL of keys + values


VIEWS = [
    View(
        "home_timeline",
        ("user_id", "author_id", "post_id"),
        ("event_time",),
        "user_id BIGINT, author_id BIGINT, post_id BIGINT, event_time BIGINT",
    ),
    View("follows", ("user_id", "followee_id"), (), "user_id BIGINT, followee_id BIGINT"),
    View(
        "posts",
        ("author_id", "post_id"),
        ("deleted", "event_time", "text"),
        "author_id BIGINT, post_id BIGINT, deleted BOOLEAN, event_time BIGINT, text STRING",
    ),
    View(
        "inbox",
        ("recipient_id", "message_id"),
        ("sender_id", "text", "event_time", "read"),
        "recipient_id BIGINT, message_id BIGINT, sender_id BIGINT, text STRING, event_time BIGINT, read BOOLEAN",
    ),
    View("unread_counts", ("user_id",), ("unread",), "user_id BIGINT, unread BIGINT"),
    View(
        "user_status", ("user_id",), ("text", "event_time"), "user_id BIGINT, text STRING, event_time BIGINT"
    ),
    View(
        "users",
        ("user_id",),
        ("handle", "display_name"),
        "user_id BIGINT, handle STRING, display_name STRING",
    ),
    View("celebrities", ("author_id",), ("followers",), "author_id BIGINT, followers BIGINT"),
    View(
        "accounting",
        ("partition",),
        ("applied", "duplicates", "rejected", "quarantined"),
        "partition INT, applied BIGINT, duplicates BIGINT, rejected BIGINT, quarantined BIGINT",
    ),
]
BY_NAME = {v.name: v for v in VIEWS}


# ``r`` returns bytes (no ``decode_responses``): its replies as this module reads them (redis-py
# types a reply for either mode of a client, bytes | str)
def _hash(r: redis.Redis, key: str) -> dict[bytes, bytes]:
    return cast(dict[bytes, bytes], r.hgetall(key))


def _stream(r: redis.Redis, key: str) -> list[tuple[bytes, dict[bytes, bytes]]]:
    return cast(list[tuple[bytes, dict[bytes, bytes]]], functions.stream_range(r, key))


def _scan(r: redis.Redis, pattern: str):
    return sorted(k.decode() for k in r.scan_iter(match=pattern, count=2000))


def _suffix(key: str) -> int:
    return int(key.rsplit(":", 1)[1])


def _batched(r: redis.Redis, keys: list[str], read) -> list:
    out = []
    for i in range(0, len(keys), 1000):
        pipe = r.pipeline(transaction=False)
        for k in keys[i : i + 1000]:
            read(pipe, k)
        out += pipe.execute()
    return out


def _follows_and_posts(r: redis.Redis, k, body_key) -> tuple[list[tuple], list[tuple]]:
    """The ``follows`` and ``posts`` rows of the keys ``k(...)`` names (one namespace, or one
    partition of it); ``body_key(author, post)``: the key of a live post's body."""
    f_keys = _scan(r, k("following", "*"))
    fs = _batched(r, f_keys, lambda p, key: p.smembers(key))
    follows = [(_suffix(key), int(a)) for key, s in zip(f_keys, fs, strict=True) for a in s]
    pid_keys = _scan(r, k("pids", "*"))
    pids = _batched(r, pid_keys, lambda p, key: p.hgetall(key))
    posts = [
        (_suffix(key), int(pid), live == b"0")
        for key, h in zip(pid_keys, pids, strict=True)
        for pid, live in h.items()
    ]
    live = [(a, pid) for a, pid, deleted in posts if not deleted]
    body_keys = [body_key(a, pid) for a, pid in live]
    bodies = dict(zip(live, _batched(r, body_keys, lambda p, key: p.get(key)), strict=True))
    rows = []
    for a, pid, deleted in posts:
        body = json.loads(bodies[a, pid]) if not deleted and bodies.get((a, pid)) else {}
        rows.append((a, pid, deleted, body.get("event_time"), body.get("text")))
    return follows, rows


def redis_rows(r: redis.Redis, ns: str, n: int, partitions: list[int]) -> dict[str, list[tuple]]:
    """Every view of namespace ``ns`` as rows (keys + values), in the layout of :data:`VIEWS`.

    ``r`` returns bytes (no ``decode_responses``). Timelines are read as the view: their first N.
    """
    k = lambda *parts: functions.key(ns, *parts)  # noqa: E731
    rows: dict[str, list[tuple]] = {}
    tl_keys = _scan(r, k("tl", "*"))
    tls = _batched(r, tl_keys, lambda p, key: p.zrevrange(key, 0, n - 1, withscores=True))
    rows["home_timeline"] = [
        (_suffix(key), author, post, int(s))
        for key, tl in zip(tl_keys, tls, strict=True)
        for (post, author), s in ((timeline_member(m), s) for m, s in tl)
    ]
    rows["follows"], rows["posts"] = _follows_and_posts(r, k, lambda a, pid: k("p", a, pid))
    m_keys = _scan(r, k("msgs", "*"))
    msgs = _batched(r, m_keys, lambda p, key: p.hgetall(key))
    rows["inbox"] = [
        (_suffix(key), int(mid), m["sender_id"], m["text"], m["event_time"], m["read"])
        for key, h in zip(m_keys, msgs, strict=True)
        for mid, m in ((mid, json.loads(v)) for mid, v in h.items())
    ]
    rows["unread_counts"] = [(int(u), int(c)) for u, c in r.hgetall(k("unread")).items() if int(c) != 0]
    rows["user_status"] = [
        (int(u), s["text"], s["event_time"])
        for u, s in ((u, json.loads(v)) for u, v in r.hgetall(k("status")).items())
    ]
    rows["users"] = [
        (int(u), s["handle"], s["display_name"])
        for u, s in ((u, json.loads(v)) for u, v in r.hgetall(k("users")).items())
    ]
    celebs = sorted(int(a) for a in r.smembers(k("celebs")))
    counts = _batched(r, [k("followers", a) for a in celebs], lambda p, key: p.scard(key))
    rows["celebrities"] = list(zip(celebs, counts, strict=True))
    rows["accounting"] = []
    for p in partitions:
        h = {kk.decode(): int(v) for kk, v in _hash(r, k("stats", p)).items()}
        rows["accounting"].append(
            (p, h.get("applied", 0), h.get("duplicates", 0), h.get("rejected", 0), h.get("quarantined", 0))
        )
    return rows


def partitioned_rows(
    r: redis.Redis, ns: str, n: int, partitions: list[int], fanout_threshold: int
) -> dict[str, list[tuple]]:
    """:func:`redis_rows` in the partitioned layout (docs/architecture.md, The partitioned layout).

    Each fact is read from the partition that owns it. Home timelines are read as users read them
    (``p_timeline``: the fanned-out entries merged with the celebrities' posts, whose threshold is
    per partition), so they are compared with the batch timeline that holds no author back; an
    author's follower count is the sum of its followers in every partition (``lfol``)."""
    from contract.serving import PartitionedStore

    rows: dict[str, list[tuple]] = {v.name: [] for v in VIEWS}
    store = PartitionedStore(r, ns, len(partitions))
    rows["home_timeline"] = [
        (u, post["author_id"], post["post_id"], post["event_time"]) for u, post in store.timeline_posts(n)
    ]
    followers: dict[int, int] = {}
    for p in partitions:
        k = lambda *parts: functions.pkey(ns, p, *parts)  # noqa: E731, B023 (used in this iteration)
        # a post's body is keyed by its timeline member: post then author, both padded
        follows, posts = _follows_and_posts(r, k, lambda a, pid, k=k: k("b", f"{pid:019d}{a:019d}"))
        rows["follows"] += follows
        rows["posts"] += posts
        m_keys = _scan(r, k("msgs", "*"))
        for key, h in zip(m_keys, _batched(r, m_keys, lambda pipe, key: pipe.hgetall(key)), strict=True):
            fields = {f.decode(): v for f, v in h.items()}
            for mid, v in fields.items():
                if not mid.endswith(":r"):  # a message's read state is the field <message>:r
                    m = json.loads(v)
                    read = f"{mid}:r" in fields
                    rows["inbox"].append(
                        (_suffix(key), int(mid), m["sender_id"], m["text"], m["event_time"], read)
                    )
        rows["unread_counts"] += [(int(u), int(c)) for u, c in r.hgetall(k("unread")).items() if int(c) != 0]
        rows["user_status"] += [
            (int(u), s["text"], s["event_time"])
            for u, s in ((u, json.loads(v)) for u, v in r.hgetall(k("status")).items())
        ]
        rows["users"] += [
            (int(u), s["handle"], s["display_name"])
            for u, s in ((u, json.loads(v)) for u, v in r.hgetall(k("users")).items())
        ]
        l_keys = _scan(r, k("lfol", "*"))
        for key, count in zip(l_keys, _batched(r, l_keys, lambda pipe, key: pipe.scard(key)), strict=True):
            followers[_suffix(key)] = followers.get(_suffix(key), 0) + int(count)
        h = {kk.decode(): int(v) for kk, v in _hash(r, k("stats")).items()}
        rows["accounting"].append(
            (p, h.get("applied", 0), h.get("duplicates", 0), h.get("rejected", 0), h.get("quarantined", 0))
        )
    rows["celebrities"] = sorted((a, c) for a, c in followers.items() if c > fanout_threshold)
    return rows


def changelog_dispositions(
    r: redis.Redis, ns: str, partitions: list[int], layout: str = "keyed"
) -> list[tuple]:
    """(partition, offset, disposition, reason) of every record, from the changelog streams (in the
    partitioned layout, an event's entry is ``<offset + 1>-0``; a delivery's, ``x``, is no record)."""
    out = []
    for p in partitions:
        stream = (
            functions.pkey(ns, p, "changelog")
            if layout == "partitioned"
            else functions.key(ns, "changelog", p)
        )
        for entry_id, fields in _stream(r, stream):
            offset = int(entry_id.split(b"-")[0])
            letter = fields[b"d"].decode()
            if layout == "partitioned":
                if letter == "x":
                    continue
                offset -= 1
            reason = fields.get(b"r")
            out.append((p, offset, LETTER[letter], reason.decode() if reason else None))
    return out


def to_frame(spark: SparkSession, rows: list[tuple], schema: str, tmp: Path) -> DataFrame:
    """Python rows -> a Spark DataFrame through a Parquet file (fast for millions of rows)."""
    struct = spark.createDataFrame([], schema).schema
    names = [f.name for f in struct.fields]
    arrow_types = {
        "LongType": pa.int64(),
        "IntegerType": pa.int32(),
        "StringType": pa.string(),
        "BooleanType": pa.bool_(),
    }
    cols: list[Sequence] = list(zip(*rows, strict=True)) if rows else [[] for _ in names]
    table = pa.table(
        {
            n: pa.array(list(c), type=arrow_types[type(f.dataType).__name__])
            for n, c, f in zip(names, cols, struct.fields, strict=True)
        }
    )
    path = tmp / f"{len(list(tmp.iterdir()))}.parquet"
    pq.write_table(table, path)
    return spark.read.schema(struct).parquet(str(path))


def batch_side(views: BatchViews, view: View) -> DataFrame:
    df = getattr(views, view.name)
    if view.name == "posts":  # Redis keeps a deleted post's tombstone only (no body)
        df = df.withColumn("event_time", F.when(~F.col("deleted"), F.col("event_time"))).withColumn(
            "text", F.when(~F.col("deleted"), F.col("text"))
        )
    if view.name == "unread_counts":  # an inbox read to the end: 0 (Redis keeps the 0)
        df = df.where(F.col("unread") != 0)
    return df.select(*view.keys, *view.values)


def compare_view(live: DataFrame, batch: DataFrame, view: View) -> dict:
    """Join on the key; a row whose values differ (or that one side lacks) is a disagreement.

    One Spark job: the row counts of both sides and the disagreements come from the same join.
    """
    keys, values = list(view.keys), list(view.values)

    def side(df: DataFrame, name: str) -> DataFrame:
        vals = F.struct(*[F.col(v) for v in values]) if values else F.lit(True)
        return df.select(*keys, vals.alias(name), F.lit(1).alias(f"_{name}"))

    joined = side(live, "live").join(side(batch, "batch"), keys, "full_outer")
    differs = ~F.col("live").eqNullSafe(F.col("batch"))
    totals = joined.agg(
        F.count("_live").alias("live_rows"),
        F.count("_batch").alias("batch_rows"),
        F.sum(F.when(differs, 1).otherwise(0)).alias("mismatches"),
    ).first()
    assert totals is not None  # an aggregate without a grouping has one row
    n = int(totals["mismatches"] or 0)
    examples = []
    if n:
        for r in joined.where(differs).orderBy(*keys).limit(EXAMPLES).collect():
            examples.append(
                {
                    "view": view.name,
                    "key": {c: r[c] for c in keys},
                    "live": r["live"].asDict() if hasattr(r["live"], "asDict") else r["live"],
                    "batch": r["batch"].asDict() if hasattr(r["batch"], "asDict") else r["batch"],
                }
            )
    return {
        "live_rows": int(totals["live_rows"]),
        "batch_rows": int(totals["batch_rows"]),
        "mismatches": n,
        "examples": examples,
        "ok": n == 0,
    }


def cross_check(
    spark: SparkSession,
    client: redis.Redis,
    redis_namespace: str,
    views: BatchViews,
    position: dict[int, int],
    timeline_length: int,
    *,
    live_dispositions: DataFrame | None = None,
    layout: str = "keyed",
    fanout_threshold: int = 0,
) -> dict:
    """Every view of the keyed state in ``redis_namespace`` (``layout``) against the batch views at
    ``position``, computed with ``timeline_length`` and ``fanout_threshold``.

    In the partitioned layout the fan-out threshold is per partition (a representation), so Redis's
    timelines are read as users read them and compared with the batch timeline that holds no
    author back (:func:`pipelines.batch_layer.definition.home_timeline_view` with no celebrities)."""
    if layout == "partitioned":
        cfg = BatchConfig(timeline_length=timeline_length, fanout_threshold=fanout_threshold)
        as_read = home_timeline_view(views.follows, views.posts, views.celebrities.limit(0), cfg)
        views = replace(views, home_timeline=as_read)
    wanted = {p: o for p, o in position.items() if o > 0}
    partitions = sorted(position)

    def covered() -> dict[int, int]:
        if layout == "partitioned":  # its own fences, when every delivery below them is applied
            own, complete = functions.partitioned_state(client, redis_namespace, len(partitions))
            return {p: o for p, o in own.items() if o > 0} if complete else {}
        return {p: o for p, o in functions.fences(client, redis_namespace).items() if o > 0}

    fences = covered()
    if fences != wanted:
        return {"ok": None, "skipped": f"Redis covers {fences}, the batch views {wanted}"}
    if layout == "partitioned":
        rows = partitioned_rows(client, redis_namespace, timeline_length, partitions, fanout_threshold)
    else:
        rows = redis_rows(client, redis_namespace, timeline_length, partitions)
    moved = covered() != wanted
    out: dict = {"position": {str(p): o for p, o in sorted(position.items())}, "views": {}}
    with tempfile.TemporaryDirectory(prefix="cross-check-") as tmp:
        for view in VIEWS:
            live = to_frame(spark, rows[view.name], view.schema, Path(tmp))
            out["views"][view.name] = compare_view(live, batch_side(views, view), view)
        if live_dispositions is not None:
            d = View("dispositions", ("partition", "offset"), ("disposition", "reason"), "")
            cols = (*d.keys, *d.values)
            out["views"]["dispositions"] = compare_view(
                live_dispositions.select(*cols), views.dispositions.select(*cols), d
            )
    out["rows_compared"] = sum(v["batch_rows"] for v in out["views"].values())
    out["mismatches"] = sum(v["mismatches"] for v in out["views"].values())
    if moved:
        out["ok"] = None
        out["skipped"] = "the live state moved past P while it was read (the stream is running)"
    else:
        out["ok"] = out["mismatches"] == 0
    return out
