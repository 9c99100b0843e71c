"""The Redis function library of the speed layer: loaded, versioned, and its state read back.

The library (``redis_functions/social.lua``) is the only place that changes the keyed state.
It is loaded with ``FUNCTION LOAD REPLACE`` whenever the version in Redis differs from the one
in this repository, so a code change reaches Redis at the next start of any processor.

Keys, all under ``<namespace>:`` (one namespace per views version, for blue/green switching).
The serving reads (:mod:`contract.serving`) use the first group; the rest is the processor's.

==================  ======  =====================================================================
``tl:<u>``          zset    fanned-out home timeline of u (latest N): member = post_id then
                            author_id, each zero-padded to 19 digits (a post is (author, post):
                            docs/views.md, "Identity"), score = corrected event time
``posts:<a>``       zset    author a's live posts, member = post_id zero-padded (read-time merge
                            of high-fan-out authors)
``p:<a>:<post>``    string  JSON of a live post of author a
``following:<u>``   set     follows(u)
``celebs``          set     authors over the fan-out threshold
``inbox:<u>``       zset    message ids of inbox(u) by event time; ``msgs:<u>`` hash id -> JSON
``unread``          hash    u -> unread(u)
``status``          hash    u -> JSON {text, event_time}
``users``           hash    u -> JSON {handle, display_name}
``erased``          set     erased user ids (tombstones, kept forever: docs/views.md, "Erasure")
``fence``           hash    partition -> next offset to apply (the log position the state covers;
                            reads return it as ``as_of``)
``layout``          string  the key format the state was written in (:func:`check_layout`)
------------------  ------  ---------------------------------------------------------------------
``followers:<a>``   set     who follows a (the fan-out targets)
``pids:<a>``        hash    post_id -> 1 live / 0 deleted (a deleted post never comes back)
``sent:<u>``        set     "<recipient>:<message>" of the messages u sent (anonymised on erasure)
``seenq:<p>``       zset    dedup memory of partition p for ids without a sequence: member
                            event_id, score its newest received_time (redis_functions/dedup.lua)
``dq:<p>``          hash    dedup memory of partition p for sequenced ids: writer ->
                            "<highest seq>:<newest received_time>:<reorder window, a byte per seq>"
``dqt:<p>``         zset    the writers of ``dq:<p>`` by newest received_time (for forgetting)
``hwm``             hash    partition -> newest received_time seen
``stats:<p>``       hash    applied, duplicates, rejected, quarantined of partition p
``changelog:<p>``   stream  one entry per record, id ``<offset>-1``: disposition, reason, changes
``freshness``       hash    10 ms bucket -> events (received -> applied), a metric, not state
``published``       hash    partition -> next offset whose changes are in the compacted topics
                            (written by :mod:`pipelines.speed.compacted`, not by the library)
==================  ======  =====================================================================
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import cast

import redis

from infra import clients

LIBRARY = Path(__file__).with_name("redis_functions") / "social.lua"
DEDUP = LIBRARY.with_name("dedup.lua")  # the dedup rule: one chunk of Lua in both libraries (@DEDUP@)
NAME = "social"


def connect(url: str) -> redis.Redis:
    """A job's client of the keyed state (bytes in and out: infra.clients, the "job" timeout)."""
    return clients.redis_client(url)


def key(namespace: str, *parts) -> str:
    return ":".join([namespace, *map(str, parts)])


# A stream's entries as XRANGE gives them, oldest first: (id, fields), bytes or str as the client
# decodes replies.
StreamEntries = list[tuple[bytes | str, dict[bytes | str, bytes | str]]]


def stream_range(
    client: redis.Redis, name: str, min: str = "-", max: str = "+", count: int | None = None
) -> StreamEntries:
    """``XRANGE`` typed as it answers: redis-py types every stream read's reply Optional and an
    entry's fields too (XCLAIM's entry of a deleted message has none); XRANGE's always has both."""
    return cast(StreamEntries, client.xrange(name, min=min, max=max, count=count))


def source() -> str:
    """The library as Redis loads it: ``social.lua`` with its VERSION line naming its content
    (:func:`version`), so an edit without a bump still loads, and a stale library cannot run."""
    return _versioned(_with_dedup(LIBRARY), version())


def version() -> str:
    """The library's VERSION line and a digest of its source: what ``social_version`` answers."""
    return _content_version(LIBRARY, LIBRARY.read_text(), DEDUP.read_text())


def _with_dedup(path: Path) -> str:
    text = path.read_text()
    if "@DEDUP@" not in text:
        raise RuntimeError(f"{path}: no @DEDUP@ placeholder")
    return text.replace("@DEDUP@", DEDUP.read_text())


def _content_version(path: Path, text: str, extra: str = "") -> str:
    import hashlib

    m = re.search(r"^local VERSION = '([^']+)'", text, re.MULTILINE)
    if m is None:
        raise RuntimeError(f"{path}: no VERSION line")
    return f"{m.group(1)}-{hashlib.sha256((text + extra).encode()).hexdigest()[:12]}"


def _versioned(text: str, version: str) -> str:
    return re.sub(r"^local VERSION = '[^']+'", f"local VERSION = '{version}'", text, count=1, flags=re.M)


def loaded_versions(client: redis.Redis) -> dict[str, str | None]:
    """What each library in Redis answers for its version (None: not loaded), beside this
    repository's: verify reports a stale one. On a Redis Cluster every master is asked (a function
    runs on the master of its keys' slot): one version where all agree, else each master's, named
    (``127.0.0.1:7001=<v>, 127.0.0.1:7002=None``), which is no version this repository has."""
    if is_cluster_client(client):
        per_node = {
            f"{node.host}:{node.port}": loaded_versions(client.get_redis_connection(node))  # type: ignore[attr-defined]
            for node in client.get_primaries()  # type: ignore[attr-defined]
        }
        merged: dict[str, str | None] = {}
        for name in ("social", "partitioned"):
            seen = {versions[name] for versions in per_node.values()}
            merged[name] = (
                seen.pop()
                if len(seen) == 1
                else ", ".join(f"{node}={versions[name]}" for node, versions in sorted(per_node.items()))
            )
        return merged
    out: dict[str, str | None] = {}
    for name, fn in (("social", "social_version"), ("partitioned", "p_version")):
        try:
            have = client.fcall_ro(fn, 0)
            out[name] = have.decode() if isinstance(have, bytes) else have
        except redis.ResponseError:
            out[name] = None
    return out


def ensure_loaded(client: redis.Redis) -> str:
    """Load the library unless Redis already has this version; returns the version in Redis."""
    return _ensure(client, "social_version", version(), source)


def _ensure(client: redis.Redis, version_function: str, want: str, text) -> str:
    """Load ``text()`` unless ``version_function`` answers ``want`` (its library is that version);
    on a Redis Cluster, on every primary, each checked on its own (a function runs on the node
    that owns its keys' slot, so each must have this version)."""
    if is_cluster_client(client):
        for node in client.get_primaries():  # type: ignore[attr-defined]
            _ensure(client.get_redis_connection(node), version_function, want, text)  # type: ignore[attr-defined]
        return want
    try:
        have = client.fcall_ro(version_function, 0)
        have = have.decode() if isinstance(have, bytes) else have
    except redis.ResponseError:
        have = None
    if have != want:
        client.function_load(text(), replace=True)
    return want


def command_stats(client: redis.Redis) -> dict[str, dict[str, float]]:
    """``INFO commandstats`` of the serving store: of a Redis Cluster, every master's summed (each
    command's calls and µs; its per-call mean recomputed), where redis-py would ask one node."""
    if not is_cluster_client(client):
        return client.info("commandstats")
    per_node = client.info("commandstats", target_nodes=client.PRIMARIES)  # type: ignore[attr-defined]
    total: dict[str, dict[str, float]] = {}
    for stats in per_node.values():
        for command, fields in stats.items():
            into = total.setdefault(command, {})
            for field, value in fields.items():
                if isinstance(value, int | float) and field != "usec_per_call":
                    into[field] = into.get(field, 0) + value
    for fields in total.values():
        fields["usec_per_call"] = fields.get("usec", 0) / max(fields.get("calls", 0), 1)
    return total


class LayoutError(RuntimeError):
    """A namespace written in another key format than this library's: rebuild it from the log."""


def is_cluster_client(client) -> bool:
    """``client`` is redis-py's Redis Cluster client (infra.clients gives one for a cluster's URL)."""
    import redis.asyncio

    return isinstance(client, redis.RedisCluster | redis.asyncio.RedisCluster)


def refuse_keyed_on_cluster(client) -> None:
    """The keyed layout's calls touch the keys of many users at once (many slots): on a Redis
    Cluster only the partitioned layout runs. One line (:class:`LayoutError`) says so."""
    if is_cluster_client(client):
        raise LayoutError(
            "the Redis at SOCIAL_REDIS_URL is a Redis Cluster, where the keyed serving layout cannot "
            "run (its calls span slots): set SOCIAL_SERVING_LAYOUT=partitioned "
            '(docs/architecture.md, "On Redis Cluster")'
        )


def layout() -> str:
    m = re.search(r"^local LAYOUT = '([^']+)'", source(), re.MULTILINE)
    if m is None:
        raise RuntimeError(f"{LIBRARY}: no LAYOUT line")
    return m.group(1)


def check_layout(client: redis.Redis, namespace: str, serving_layout: str = "keyed") -> None:
    """Refuse (one line, :class:`LayoutError`) a namespace whose state an older library or the
    other serving layout (``SOCIAL_SERVING_LAYOUT``) wrote.

    State from before ``layout`` existed (layout 1: a post keyed by its id alone) has a fence and
    no ``layout`` key. An empty namespace is fine: the first ``social_apply`` stamps it (in the
    partitioned layout, each partition's first call stamps its own; the partitioned library refuses
    a partition stamped by another version of it). On a Redis Cluster the keyed layout is refused
    (:func:`refuse_keyed_on_cluster`)."""
    if serving_layout != "partitioned":
        refuse_keyed_on_cluster(client)
    keyed = client.exists(key(namespace, "layout"), key(namespace, "fence")) > 0
    partitioned = client.exists(pkey(namespace, 0, "layout"), pkey(namespace, 0, "fence")) > 0
    other = {"keyed": partitioned, "partitioned": keyed}[serving_layout]
    if other:
        held = "partitioned" if serving_layout == "keyed" else "keyed"
        raise LayoutError(
            f"Redis namespace {namespace!r} holds state of the {held} serving layout and "
            f"SOCIAL_SERVING_LAYOUT={serving_layout}: rebuild it in this layout with "
            f"`python -m pipelines.rebuild run`, or set SOCIAL_SERVING_LAYOUT={held} "
            f'(docs/architecture.md, "Upgrading")'
        )
    if serving_layout == "partitioned":
        return
    have = client.get(key(namespace, "layout"))
    have = have.decode() if isinstance(have, bytes) else have
    if have is None and not client.exists(key(namespace, "fence")):
        return
    if have != layout():
        raise LayoutError(
            f"Redis namespace {namespace!r} holds state of key layout {have or '1'}, this code writes "
            f"layout {layout()}: rebuild it from the log with `python -m pipelines.rebuild run` "
            f'(docs/architecture.md, "Upgrading")'
        )


def fences(client: redis.Redis, namespace: str) -> dict[int, int]:
    """Partition -> next offset to apply: the log position the keyed state covers."""
    raw = client.hgetall(key(namespace, "fence"))
    return {int(p): int(o) for p, o in sorted(raw.items(), key=lambda kv: int(kv[0]))}


def layout_fences(
    client: redis.Redis, namespace: str, layout: str, partitions: int, *, whole: bool = True
) -> dict[int, int]:
    """:func:`fences` in either layout (``SOCIAL_SERVING_LAYOUT``). In the partitioned layout a
    partition's own fence, lowered (``whole``) to the offset below which every other partition has
    its deliveries too: the position whose state is complete. Empty when nothing was applied."""
    if layout != "partitioned":
        return fences(client, namespace)
    pipe = client.pipeline(transaction=False)
    for p in range(partitions):
        pipe.get(pkey(namespace, p, "fence"))
    for p in range(partitions):
        pipe.hgetall(pkey(namespace, p, "dfence"))
    got = pipe.execute()
    own = {p: int(v) for p, v in enumerate(got[:partitions]) if v is not None}
    if not whole:
        return own
    delivered = [{int(s): int(o) for s, o in raw.items()} for raw in got[partitions:]]
    return {
        s: min([o] + [delivered[q].get(s, 0) for q in range(partitions) if q != s]) for s, o in own.items()
    }


def stats_key(namespace: str, partition: int, layout: str = "keyed") -> str:
    """The hash of a partition's accounting (applied, duplicates, rejected, quarantined, and in
    the partitioned layout ``deliveries_quarantined``)."""
    return (
        pkey(namespace, partition, "stats") if layout == "partitioned" else key(namespace, "stats", partition)
    )


def freshness_histogram(client: redis.Redis, namespace: str, layout: str, partitions) -> dict[int, int]:
    """Server receive -> visible in Redis, events per 10 ms bucket (keyed: applied; partitioned:
    delivered to every partition, recorded per source partition)."""
    if layout != "partitioned":
        return {int(b): int(n) for b, n in client.hgetall(key(namespace, "freshness")).items()}
    pipe = client.pipeline(transaction=False)
    for p in partitions:
        pipe.hgetall(pkey(namespace, p, "freshness"))
    hist: dict[int, int] = {}
    for raw in pipe.execute():
        for b, n in raw.items():
            hist[int(b)] = hist.get(int(b), 0) + int(n)
    return hist


def accounting(
    client: redis.Redis, namespace: str, partitions: list[int], layout: str = "keyed"
) -> dict[str, int]:
    """Events applied, duplicates, rejected and quarantined, summed over partitions (in the
    partitioned layout also ``deliveries_quarantined``)."""
    totals = {"applied": 0, "duplicates": 0, "rejected": 0, "quarantined": 0}
    pipe = client.pipeline(transaction=False)
    for p in partitions:
        pipe.hgetall(stats_key(namespace, p, layout))
    for stats in pipe.execute():
        for name, n in stats.items():
            name = name.decode() if isinstance(name, bytes) else name
            totals[name] = totals.get(name, 0) + int(n)
    return totals


def partitioned_state(client: redis.Redis, namespace: str, partitions: int) -> tuple[dict[int, int], bool]:
    """The partitioned layout's position: every partition's own fence, and whether the state is
    complete there (every partition has every other's deliveries below those fences)."""
    own = layout_fences(client, namespace, "partitioned", partitions, whole=False)
    whole = layout_fences(client, namespace, "partitioned", partitions, whole=True)
    return own, own == whole


def drop_namespace(r: redis.Redis, namespace: str) -> int:
    """Remove every key of a namespace (a scratch replay); returns how many."""
    n = 0
    batch = []
    for k in r.scan_iter(match=f"{namespace}:*", count=2000):
        batch.append(k)
        if len(batch) >= 1000:
            n += r.unlink(*batch)
            batch = []
    if batch:
        n += r.unlink(*batch)
    return n


# --- the partitioned layout (docs/architecture.md, "The partitioned layout") -------------------
PARTITIONED = LIBRARY.with_name("partitioned.lua")
PROTOCOL_FILE = LIBRARY.with_name("protocol.json")


def protocol() -> dict:
    """The call protocol between the processor and ``partitioned.lua``: one schema, read here by the
    encoder and substituted into the library's source when it is loaded (:func:`partitioned_source`)."""
    import json

    return json.loads(PROTOCOL_FILE.read_text())


def partitioned_source() -> str:
    """The library as Redis loads it: ``partitioned.lua`` with ``protocol.json`` in its place."""
    text = _with_dedup(PARTITIONED)
    if "@PROTOCOL@" not in text:
        raise RuntimeError(f"{PARTITIONED}: no @PROTOCOL@ placeholder")
    text = text.replace("@PROTOCOL@", _lua({k: v for k, v in protocol().items() if not k.startswith("_")}))
    # the version Redis reports names this source and protocol exactly: any change is loaded
    return _versioned(text, partitioned_version())


def _lua(value) -> str:
    """A JSON value (objects, lists, strings) as a Lua table constructor (a library cannot call
    cjson while it is being loaded)."""
    import json

    if isinstance(value, dict):
        return "{" + ",".join(f"[{json.dumps(k)}]={_lua(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "{" + ",".join(_lua(v) for v in value) + "}"
    if isinstance(value, str):
        return json.dumps(value)
    raise TypeError(f"protocol.json: {value!r} is not a string, list or object")


def partitioned_version() -> str:
    """The library's VERSION line and a digest of its source and protocol."""
    return _content_version(
        PARTITIONED, PARTITIONED.read_text(), PROTOCOL_FILE.read_text() + DEDUP.read_text()
    )


def ensure_partitioned_loaded(client: redis.Redis) -> str:
    """Load ``partitioned.lua`` unless Redis has this version of it (with this protocol)."""
    return _ensure(client, "p_version", partitioned_version(), partitioned_source)


def pkey(namespace: str, partition: int, *parts) -> str:
    """A key of the partitioned layout: ``<ns>:{<partition>}:<parts...>`` (hash-tagged by the Kafka
    partition that owns it, so a partition's keys share one Redis Cluster slot)."""
    return ":".join([f"{namespace}:{{{partition}}}", *map(str, parts)])
