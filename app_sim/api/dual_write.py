"""THE ANTI-PATTERN, ON PURPOSE: an app API that writes the serving store itself *and* the log.

Off by default. ``SOCIAL_WRITE_MODE=dual`` turns it on, for ``make dual-write`` only
(``stories/dual_write.py``), which measures how the store it produces diverges from the log under
faults, side by side with the design (``SOCIAL_WRITE_MODE=log``: the API only appends to the log
and the speed layer derives the store). Nothing else in the project uses it; do not copy it.

Dual mode: the API writes the store under ``SOCIAL_DUAL_NAMESPACE`` with the serving store's key
layout (``contract/serving.py``: ``users``, ``status``, ``following:<u>``, ``p:<id>``,
``posts:<a>``, ``tl:<u>``, ``msgs:<u>``, ``inbox:<u>``, ``unread``) plus ``followers:<a>`` (a set
the fan-out needs; the speed layer keeps it in its own state). One write goes, as a typical
application does it, with no transaction across the stores:

1. the primary record in the store: the message in the inbox, the post, the status, the follow,
   the user, the read flag of a message;
2. the event appended to the log (as in log mode: validated, acknowledged by the broker);
3. the derived parts in the store: the unread counter by read-modify-write (HGET, +-1, HSET),
   the timeline fan-out to the author's followers, a new followee's posts into the follower's
   timeline (removed on unfollow). An error here is logged and swallowed: the event is already
   published, so the request answers 202 ("the cache will catch up"; it never does).

Faults (``SOCIAL_FAULT_*_PERMILLE``, per mille of writes; each API worker draws from its own
``random.Random`` per fault, seeded by ``SOCIAL_FAULT_SEED``, the fault and the worker id, so a
seed fixes every worker's sequence of draws; which requests meet them depends on scheduling):

=============  ==============================================================  ===================
fault          what happens                                                    failure (dual mode)
=============  ==============================================================  ===================
``crash``      the worker process exits (``os._exit``) right after the first   partial write
               write of the request (dual: the store, before the log; log
               mode: the log append); uvicorn starts a new worker
``race``       the unread counter's read-modify-write is held open up to       lost update
               ``SOCIAL_FAULT_RACE_MS`` between its read and its write, so
               two workers writing one inbox overwrite each other
``timeout``    the request stalls ``SOCIAL_FAULT_STALL_MS`` just before its    out-of-order write
               log append (dual: after its store write; a slow producer, a
               GC pause); the client times out, its retry (same
               ``Idempotency-Key``) is answered 409 while the original is
               in flight, and the client's next write of the same record
               (a status) lands in the store and the log meanwhile; the
               stalled original then reaches the log last: the store and
               the log saw the two writes in opposite orders
``store_fail`` step 3 fails after the log append succeeded                     partial write
=============  ==============================================================  ===================

Log mode with faults draws the same faults at the same points of a request (a crash after the
append, the stall just before it, the race's hold where dual mode holds its counter); they delay or kill
requests but cannot make the derived store disagree with the log. ``store_fail`` has no store
write to fail in log mode.

Every fault is journaled before it acts (``RPUSH faults:<topic>`` of a JSON object: fault, mode,
worker, event type and ids), so the experiment can say which failure each divergence is.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random

import orjson

import contract
from app_sim.api.eventlog import Appended, InvalidEvent
from contract.ids import wall_clock_ms

log = logging.getLogger("app_sim.api.dual_write")

MODES = ("log", "dual")
FAULTS = ("crash", "race", "timeout", "store_fail")
FAILURE = {
    "crash": "partial write",
    "race": "lost update",
    "timeout": "out-of-order write",
    "store_fail": "partial write",
}
CRASH_EXIT = 70  # not uvicorn's STARTUP_FAILURE (3), so the supervisor starts a new worker
PAD = 19  # zero-padded ids, as contract/serving.py writes zset members
_EVENT_FIELDS = ("event_id", "type", "user_id", "recipient_id", "followee_id", "post_id", "message_id")


def journal_key(topic: str) -> str:
    return f"faults:{topic}"


def fault_rates(settings) -> dict[str, int]:
    return {f: int(getattr(settings, f"fault_{f}_permille")) for f in FAULTS}


def corrected_time(event: dict) -> int:
    """The corrected event time of docs/events.md: device_time + (received_time - sent_time)."""
    return event["device_time"] + (event["received_time"] - event["sent_time"])


def _pid(ident: int) -> str:
    return str(ident).zfill(PAD)


def wrap(event_log, client, settings, worker_id: int):
    """The API's event log, wrapped when dual mode or a fault is on; else the log itself."""
    if settings.write_mode not in MODES:
        raise ValueError(f"SOCIAL_WRITE_MODE={settings.write_mode!r}: expected one of {', '.join(MODES)}")
    rates = fault_rates(settings)
    for fault, rate in rates.items():
        if not 0 <= rate <= 1000:
            raise ValueError(f"SOCIAL_FAULT_{fault.upper()}_PERMILLE={rate}: expected 0..1000")
    if settings.write_mode == "log" and not any(rates.values()):
        return event_log
    return FaultyWrites(event_log, client, settings, worker_id)


class FaultyWrites:
    """Same interface as :class:`~app_sim.api.eventlog.EventLog` (``append``, ``close``, ``topic``)."""

    def __init__(self, event_log, client, settings, worker_id: int):
        self.log = event_log
        self.topic = event_log.topic
        self.r = client  # redis.asyncio, decode_responses=True
        self.settings = settings
        self.dual = settings.write_mode == "dual"
        self.ns = settings.dual_namespace
        self.rates = fault_rates(settings)
        self.worker_id = worker_id
        self.rng = {f: random.Random(f"{settings.fault_seed}:{f}:{worker_id}") for f in FAULTS}

    def close(self, timeout_s: float = 10.0) -> int:
        return self.log.close(timeout_s)

    def k(self, *parts) -> str:
        return ":".join([self.ns, *map(str, parts)])

    def _draw(self, fault: str) -> bool:
        rate = self.rates[fault]
        return rate > 0 and self.rng[fault].random() * 1000 < rate

    async def _journal(self, fault: str, event: dict, **extra) -> None:
        entry = {
            "fault": fault,
            "mode": self.settings.write_mode,
            "worker": self.worker_id,
            "at": wall_clock_ms(),
            **{f: event[f] for f in _EVENT_FIELDS if event.get(f) is not None},
            **extra,
        }
        await self.r.rpush(journal_key(self.topic), orjson.dumps(entry))

    async def append(self, event: dict) -> Appended:
        reason = contract.validate(event)
        if reason is not None:
            raise InvalidEvent(reason)
        crash = self._draw("crash")
        state = await self._primary(event) if self.dual else None  # 1. the store
        if crash and self.dual:
            await self._crash(event, "after the store write, before the log append")
        if self._draw("timeout"):  # a slow producer, a GC pause: between the two writes
            await self._journal("timeout", event, stall_ms=self.settings.fault_stall_ms)
            await asyncio.sleep(self.settings.fault_stall_ms / 1000)
        at = await self.log.append(event)  # 2. the log
        if crash:
            await self._crash(event, "after the log append")
        if self.dual:  # 3. the derived parts of the store
            if self._draw("store_fail"):
                await self._journal("store_fail", event)
                log.warning(
                    "store update failed after the log append: %s %s", event["type"], event["event_id"]
                )
            else:
                try:
                    await self._derived(event, state)
                except Exception:  # noqa: BLE001 - the anti-pattern: log it, answer 202 anyway
                    log.exception("store update failed after the log append")
        elif event["type"] in ("message_sent", "message_read"):
            await self._race_hold(event)  # the same hold as dual mode's counter update, on nothing
        return at

    async def _crash(self, event: dict, where: str) -> None:
        await self._journal("crash", event, where=where)
        os._exit(CRASH_EXIT)

    async def _race_hold(self, event: dict) -> None:
        if self._draw("race"):
            held = int(self.rng["race"].random() * self.settings.fault_race_ms)
            await self._journal("race", event, held_ms=held)
            await asyncio.sleep(held / 1000)

    # -- the store writes of dual mode ------------------------------------------------------------

    async def _primary(self, e: dict):
        k, t, u, kind = self.k, corrected_time(e), e["user_id"], e["type"]
        if kind == "message_read":  # read-modify-write of the message's read flag
            raw = await self.r.hget(k("msgs", u), e["message_id"])
            if raw is None:
                return False
            body = orjson.loads(raw)
            if body["read"]:
                return False
            body["read"] = True
            await self.r.hset(k("msgs", u), e["message_id"], orjson.dumps(body))
            return True
        p = self.r.pipeline(transaction=False)
        if kind == "user_registered":
            p.hset(k("users"), u, orjson.dumps({"handle": e["handle"], "display_name": e["display_name"]}))
        elif kind == "status_updated":
            p.hset(k("status"), u, orjson.dumps({"text": e["text"], "event_time": t}))
        elif kind == "followed":
            p.sadd(k("following", u), e["followee_id"])
            p.sadd(k("followers", e["followee_id"]), u)
        elif kind == "unfollowed":
            p.srem(k("following", u), e["followee_id"])
            p.srem(k("followers", e["followee_id"]), u)
        elif kind == "post_created":
            post = {"post_id": e["post_id"], "author_id": u, "text": e["text"], "event_time": t}
            p.set(k("p", u, e["post_id"]), orjson.dumps(post))
            p.zadd(k("posts", u), {_pid(e["post_id"]): t})
        elif kind == "post_deleted":
            p.delete(k("p", u, e["post_id"]))
            p.zrem(k("posts", u), _pid(e["post_id"]))
        elif kind == "message_sent":
            r, mid = e["recipient_id"], e["message_id"]
            body = {"message_id": mid, "sender_id": u, "text": e["text"], "event_time": t, "read": False}
            p.hset(k("msgs", r), mid, orjson.dumps(body))
            p.zadd(k("inbox", r), {_pid(mid): t})
        await p.execute()
        return None

    async def _derived(self, e: dict, state) -> None:
        k, t, u, kind = self.k, corrected_time(e), e["user_id"], e["type"]
        n = self.settings.timeline_length
        if kind == "message_sent":
            await self._bump_unread(e["recipient_id"], +1, e)
        elif kind == "message_read" and state:
            await self._bump_unread(u, -1, e)
        elif kind in ("post_created", "post_deleted"):
            member = _pid(e["post_id"]) + _pid(u)  # a timeline member: post, then author
            readers = {u, *map(int, await self.r.smembers(k("followers", u)))}
            p = self.r.pipeline(transaction=False)
            for reader in readers:
                if kind == "post_created":
                    p.zadd(k("tl", reader), {member: t})
                    p.zremrangebyrank(k("tl", reader), 0, -(n + 1))
                else:
                    p.zrem(k("tl", reader), member)
            await p.execute()
        elif kind == "followed":
            a = e["followee_id"]
            posts = await self.r.zrange(k("posts", a), 0, -1, withscores=True)
            if posts:
                await self.r.zadd(k("tl", u), {m + _pid(a): s for m, s in posts})
                await self.r.zremrangebyrank(k("tl", u), 0, -(n + 1))
        elif kind == "unfollowed":
            a = e["followee_id"]
            posts = await self.r.zrange(k("posts", a), 0, -1)
            if posts:
                await self.r.zrem(k("tl", u), *(m + _pid(a) for m in posts))

    async def _bump_unread(self, user_id: int, delta: int, event: dict) -> None:
        """The counter as a typical app keeps it: read it, add, write it back (no INCR, no WATCH)."""
        current = int(await self.r.hget(self.k("unread"), user_id) or 0)
        await self._race_hold(event)
        await self.r.hset(self.k("unread"), user_id, current + delta)
