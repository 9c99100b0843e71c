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
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from contract.functions import key

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


def first_offset(client: redis.Redis, namespace: str, partition: int) -> int | None:
    """The offset of the oldest entry still in Redis for a partition (None: the stream is empty)."""
    got = client.xrange(key(namespace, "changelog", partition), count=1)
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
        got = client.xrange(stream, min=lo, max=f"{end - 1}-1", count=page)
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


def trim(client: redis.Redis, namespace: str, upto: dict[int, int]) -> None:
    """Drop the entries below ``upto`` (archived in Delta): Redis keeps only the changelog tail."""
    pipe = client.pipeline(transaction=False)
    for p, end in upto.items():
        pipe.xtrim(key(namespace, "changelog", p), minid=f"{end}-0", approximate=False)
    pipe.execute()
