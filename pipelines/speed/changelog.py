"""The changelog: every record's disposition and view changes, as the Redis functions logged them.

Written by ``social_apply`` in the same atomic step as the state and the fence (one Redis stream
per Kafka partition, ``<ns>:changelog:<p>``, entry id ``<offset>-1``, so one entry per offset by
construction). Read here by the archiver (:mod:`pipelines.archiver`), which appends it to Delta
and then trims the streams up to what Delta holds. Fields of an entry:

=====  ==========================================================================================
``d``  disposition: ``a`` applied, ``d`` duplicate, ``r`` rejected (valid shape, not applicable),
       ``q`` quarantined (the contract rejected the record, or processing it failed)
``r``  the reason, for ``r`` and ``q``
``s``  global sequence number: the order Redis applied events in, across partitions
``c``  JSON list of view changes, each ``[kind, key..., values...]`` with absolute values
       (numbers as integer strings):
       ``U`` user, handle, display_name, event_time | ``S`` user, text, event_time |
       ``F+`` user, followee, event_time | ``F-`` user, followee |
       ``P`` author, post, created_time, text, deleted 0/1, deleted_time |
       ``I`` recipient, message, sender, text, event_time, read 0/1 | ``N`` user, unread |
       ``C`` author, celebrity 0/1, followers |
       removals by an erasure (docs/views.md, "Erasure"): ``U-`` user | ``S-`` user |
       ``P-`` author, post | ``I-`` recipient, message | ``N-`` user (the row is deleted; a
       message the erased user sent is an ``I`` with sender ``0`` and text null)
``t``  timeline changes, comma-separated items grouped by post: ``+member:event_time:user user ...``
       (the post entered these users' timelines) or ``-member:user user ...`` (it left them), the
       member as ``tl:<user>`` holds it: the post id then the author id, zero-padded to 19 digits
       each (a timeline entry is the post (author, post): docs/views.md, "Identity"); a
       (user, member) pair changes at most once per entry. Then one ``~member:event_time:user``
       per timeline trimmed: it dropped every entry below (event_time, member), its lowest kept
       (the amortised trim back to N + S/2 logs its bound, not the entries it dropped); it applies
       to the entries of that timeline whose last change is in this entry or before. Read by
       the tests that check the fan-out; not archived (:func:`read` leaves it out): Delta derives
       ``home_timeline`` from the facts (:mod:`pipelines.derived`)
=====  ==========================================================================================

The value of any key after the events of a consistent cut (:func:`cut`) is its last change in
``(s, position in the entry)`` order among the entries of that cut: the compaction's rule
(:mod:`pipelines.compaction`).

In the partitioned layout (``<ns>:{<p>}:changelog``, docs/architecture.md) an event's entry is
``<offset + 1>-0`` with no ``s`` (there is no global order); the changes a delivery made to facts
the partition owns (an erasure's edges and messages) are an entry ``<fence>-<n>`` with ``d`` ``x``
and ``src`` ``<source partition>:<offset>``, n counting from 1 at that fence. A key belongs to one
partition, so its last change is the last in its partition's stream order (:func:`order`); a
consistent cut is a position every partition marked (:class:`SettledCuts`), and its entries are
those caused below it (:func:`read_partitioned`).
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from contract.functions import key, pkey, stream_range

DISPOSITIONS = {"a": "applied", "d": "duplicate", "r": "rejected", "q": "quarantined"}


@dataclass(frozen=True)
class Cut:
    """A consistent cut of the keyed state: the fences and the sequence number, read atomically."""

    seq: int
    fences: dict[int, int]  # partition -> next offset to apply (exclusive end)


def cut(client: redis.Redis, namespace: str) -> Cut:
    raw = client.fcall_ro("social_cut", 0, namespace)
    pairs = raw[1:]
    fences = {int(pairs[i]): int(pairs[i + 1]) for i in range(0, len(pairs), 2)}
    return Cut(seq=int(raw[0]), fences=dict(sorted(fences.items())))


class SettledCuts:
    """The partitioned layout's consistent cut: the newest log position P every partition's state
    was at, each at a moment of its own (docs/architecture.md, "The partitioned layout").

    A partition's state covers its own log below its fence and each source's deliveries below its
    ``dfence``; after every ``p_deliver`` that leaves it complete (its own deliveries at its fence)
    it appends that vector to its ``marks`` stream. A vector every partition marked is a position
    P whose changelog entries are exactly those caused below P (an event below its partition's
    offset, a delivery whose source offset is below its source's): each partition wrote all of
    those before its mark and none after, whatever the interleaving. A speed layer's micro-batch
    ends at one: each task delivers its partitions' outboxes to every partition after applying
    them. Marks are read incrementally (a stream capped in Redis); calling returns the newest cut
    found, all zeros before the first.
    """

    def __init__(self, client: redis.Redis, namespace: str, partitions: int):
        self.r, self.ns, self.partitions = client, namespace, partitions
        self.read_from = dict.fromkeys(range(partitions), "-")
        self.seen: dict[int, set[tuple[int, ...]]] = {p: set() for p in range(partitions)}
        self.best: tuple[int, ...] = (0,) * partitions

    def __call__(self) -> Cut:
        pipe = self.r.pipeline(transaction=False)
        for p in range(self.partitions):
            pipe.xrange(pkey(self.ns, p, "marks"), min=self.read_from[p], max="+")
        for p, got in enumerate(pipe.execute()):
            for _id, fields in got:
                dfence = {int(s): int(o) for s, o in fields.items()}
                self.seen[p].add(tuple(dfence.get(s, 0) for s in range(self.partitions)))
            if got:
                self.read_from[p] = "(" + _text(got[-1][0])
        common = set.intersection(*self.seen.values()) if self.seen else set()
        if common:  # each partition's marks only grow: the common ones are a chain
            self.best = max(common, key=sum)
            for p in self.seen:  # what is not past the best can never be newer
                self.seen[p] = {v for v in self.seen[p] if sum(v) > sum(self.best)}
        return Cut(seq=0, fences=dict(enumerate(self.best)))


def order(entry_id: str) -> int:
    """A partitioned changelog entry's place in its partition's order as one integer (its id
    ``<ms>-<n>``: ms the partition's fence, n 0 for its event and 1, 2, ... for deliveries after)."""
    ms, n = (int(x) for x in entry_id.split("-"))
    if n >= 1 << 20:
        raise ValueError(f"changelog entry {entry_id}: over 2^20 deliveries at one fence")
    return (ms << 20) | n


def read_partitioned(
    client: redis.Redis,
    namespace: str,
    partition: int,
    start: dict[int, int],
    end: dict[int, int],
    page: int = 10_000,
) -> list[dict]:
    """The entries of ``partition`` caused in ``[start, end)`` (both settled cuts): its events of
    offsets ``[start[p], end[p])`` and the deliveries from every source ``s`` of offsets
    ``[start[s], end[s])``, in order, as :func:`read` gives them (``seq``: :func:`order`; a
    delivery's ``offset`` None, ``disposition`` ``x``, ``reason`` ``delivery <source>:<offset>``).

    Where they are: every one was written while the partition's fence was in ``[start[p],
    end[p]]``, so their ids' ms too; those at the bounds are filtered by cause."""
    out: list[dict] = []
    stream = pkey(namespace, partition, "changelog")
    lo, hi = f"{start[partition]}-0", f"{end[partition]}-{(1 << 64) - 1}"
    while True:
        got = stream_range(client, stream, min=lo, max=hi, count=page)
        for entry_id, fields in got:
            eid = _text(entry_id)
            f = {_text(k): _text(v) for k, v in fields.items()}
            reason: str | None
            if f["d"] == "x":
                src, offset = (int(x) for x in f["src"].split(":"))
                if not start.get(src, 0) <= offset < end.get(src, 0):
                    continue
                row_offset, reason = None, f"delivery {f['src']}"
            else:
                row_offset = int(eid.split("-")[0]) - 1
                if not start[partition] <= row_offset < end[partition]:
                    continue
                reason = f.get("r")
            out.append(
                {
                    "partition": partition,
                    "offset": row_offset,
                    "seq": order(eid),
                    "disposition": f["d"],
                    "reason": reason,
                    "changes": f.get("c"),
                }
            )
        if len(got) < page:
            return out
        lo = f"({_text(got[-1][0])}"


def first_offset(client: redis.Redis, namespace: str, partition: int) -> int | None:
    """The offset of the oldest entry still in Redis for a partition (None: the stream is empty)."""
    got = stream_range(client, key(namespace, "changelog", partition), count=1)
    return int(_text(got[0][0]).split("-")[0]) if got else None


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else v


def read(client: redis.Redis, namespace: str, partition: int, start: int, end: int, page: int = 10_000):
    """Entries of offsets ``[start, end)`` as dicts (partition, offset, seq, disposition, reason,
    changes), in order."""
    out: list[dict] = []
    stream = key(namespace, "changelog", partition)
    lo = f"{start}-0"
    while start < end:
        got = stream_range(client, stream, min=lo, max=f"{end - 1}-1", count=page)
        for entry_id, fields in got:
            f = {_text(k): _text(v) for k, v in fields.items()}
            out.append(
                {
                    "partition": partition,
                    "offset": int(_text(entry_id).split("-")[0]),
                    "seq": int(f["s"]),
                    "disposition": f["d"],
                    "reason": f.get("r"),
                    "changes": f.get("c"),
                }
            )
        if len(got) < page:
            break
        lo = f"({_text(got[-1][0])}"
    return out


def trim(client: redis.Redis, namespace: str, upto: dict[int, int], partitioned: bool = False) -> None:
    """Drop the entries below ``upto`` (archived in Delta): Redis keeps only the changelog tail.

    In the partitioned layout ``upto`` is a settled cut P, and partition p's entries with ids below
    ``<P[p]>-0`` go: each was written while p's fence was below P[p], so before p marked P, and
    everything p wrote before that mark is caused below P (archived). Those at ``<P[p]>-<n>`` stay
    (some may be caused at or after P)."""
    pipe = client.pipeline(transaction=False)
    for p, end in upto.items():
        stream = pkey(namespace, p, "changelog") if partitioned else key(namespace, "changelog", p)
        pipe.xtrim(stream, minid=f"{end}-0", approximate=False)
    pipe.execute()
