"""Key-by-key comparison of two keyed-state namespaces in Redis (live vs its replay).

Every key of the state (:mod:`contract.functions`) is read by type and compared as
content, not as bytes (Redis may encode the same set differently after a different history).
Timelines are compared as the view: their first N entries (the slack beyond N is history-
dependent by design). Changelog streams are compared by entry id (one per offset), disposition and
reason: which event a cross-partition change (a fan-out into a timeline, a celebrity flip) is
logged under depends on how the partitions interleaved, while the state they sum up to does not.
The archiver trims a live stream below what Delta holds, so streams are compared where both
still have entries. The freshness histogram (a metric) and the sequence counter (the order of
application, history-dependent by design) are left out.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import redis

SKIP = {"freshness", "seq", "published"}  # a metric; the order of application; a publisher's position
# The partitioned layout's keys (``{<p>}:<name>...``) whose content is history, not state: the
# complete states a partition marked, its undelivered outbox, a delivery it could not apply (counted
# in ``stats`` too, which is compared).
SKIP_PARTITIONED = {"marks", "out", "dlq"}
EXAMPLES = 5


def _read(pipe, kind: str, key: str, n: int) -> None:
    if kind == "zset":
        # the view of a timeline is its first N; every other zset is compared whole
        stop = n - 1 if ":tl:" in key else -1
        pipe.zrevrange(key, 0, stop, withscores=True)
    elif kind == "hash":
        pipe.hgetall(key)
    elif kind == "set":
        pipe.smembers(key)
    elif kind == "string":
        pipe.get(key)
    elif kind == "stream":
        pipe.xrange(key)
    else:
        pipe.type(key)


def _suffixes(r: redis.Redis, namespace: str) -> dict[str, str]:
    prefix = f"{namespace}:"
    keys = [k.decode() for k in r.scan_iter(match=prefix + "*", count=2000)]
    keys = [k for k in keys if _family(k[len(prefix) :]) not in SKIP | SKIP_PARTITIONED]
    pipe = r.pipeline(transaction=False)
    for k in keys:
        pipe.type(k)
    return {k[len(prefix) :]: t.decode() for k, t in zip(keys, pipe.execute(), strict=True)}


def _contents(r: redis.Redis, namespace: str, suffixes: list[str], kinds: dict[str, str], n: int) -> list:
    out = []
    for i in range(0, len(suffixes), 1000):
        pipe = r.pipeline(transaction=False)
        for s in suffixes[i : i + 1000]:
            _read(pipe, kinds[s], f"{namespace}:{s}", n)
        out += pipe.execute()
    return [_canonical(v, kinds[s]) for v, s in zip(out, suffixes, strict=True)]


def _family(suffix: str) -> str:
    """A key's family: its name after the namespace, past a partition's hash tag ``{<p>}``."""
    head, _, rest = suffix.partition(":")
    if head.startswith("{") and head.endswith("}"):
        head = rest.split(":", 1)[0]
    return head


def _canonical(v, kind: str):
    if kind == "set":
        return sorted(v)
    if kind == "stream":
        # a changelog's records; a partitioned changelog's deliveries (x: at fence-n ids that
        # depend on how the partitions interleaved) are left out, the state they made is compared
        return [(i, f.get(b"d"), f.get(b"r")) for i, f in v if f.get(b"d") != b"x"]
    return v


def compare_namespaces(r: redis.Redis, live: str, replayed: str, timeline_length: int) -> dict:
    """Per key family (``tl``, ``inbox``, ``fence``, ...): keys, mismatching keys, examples."""
    a, b = _suffixes(r, live), _suffixes(r, replayed)
    # what a key missing on one side reads as, per kind (a list, a dict or None)
    empty: dict[str, Any] = {"zset": [], "hash": {}, "set": [], "string": None, "stream": []}
    names = sorted(set(a) | set(b))
    kinds = {s: a.get(s) or b[s] for s in names}  # every name is in a or b
    present_a = [s for s in names if s in a]
    present_b = [s for s in names if s in b]
    va = dict(zip(present_a, _contents(r, live, present_a, kinds, timeline_length), strict=True))
    vb = dict(zip(present_b, _contents(r, replayed, present_b, kinds, timeline_length), strict=True))
    families: dict[str, dict] = defaultdict(lambda: {"keys": 0, "mismatches": 0, "examples": []})
    for s in names:
        fam = families[_family(s)]
        fam["keys"] += 1
        left, right = va.get(s, empty[kinds[s]]), vb.get(s, empty[kinds[s]])
        if kinds[s] == "stream":
            left, right = _overlap(left, right)
        if left != right and not (not left and not right):
            fam["mismatches"] += 1
            if len(fam["examples"]) < EXAMPLES:
                fam["examples"].append({"key": s, "live": _short(left), "replayed": _short(right)})
    result = {name: dict(v, ok=v["mismatches"] == 0) for name, v in sorted(families.items())}
    return {
        "families": result,
        "keys": sum(v["keys"] for v in result.values()),
        "mismatches": sum(v["mismatches"] for v in result.values()),
        "ok": all(v["ok"] for v in result.values()),
    }


def _overlap(a: list, b: list) -> tuple[list, list]:
    """Two changelogs from the later of their first ids on (the older part is archived)."""
    if not a or not b:
        return [], []
    first = max(_id(a[0][0]), _id(b[0][0]))
    return [e for e in a if _id(e[0]) >= first], [e for e in b if _id(e[0]) >= first]


def _id(entry_id) -> tuple[int, int]:
    ms, seq = (entry_id.decode() if isinstance(entry_id, bytes) else entry_id).split("-")
    return int(ms), int(seq)


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 300 else text[:300] + "..."
