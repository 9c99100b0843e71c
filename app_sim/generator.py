"""The direct load generator: a simulated social network appending events to ``social.events``.

It drives the log harder than the HTTP API can (the API and Locust drive it realistically).
Everything it writes keeps the event contract (``contract``), plus a small, *counted*
share of invalid events and duplicates, so the speed layer's accounting can be checked:
events read = applied + duplicates + quarantined, per reason.

Model, in log order:

1. ``users`` ``user_registered`` events, then the follower graph (``app_sim.graph``: power-law
   popularity, mean ~75 followers) as ``followed`` events, in random order.
2. Activity: each slot draws a type from ``mix`` and an actor from a heavy-tailed activity
   distribution. Posts are most common; ``post_deleted`` removes one of the author's own earlier
   posts; ``followed`` picks a popular target, ``unfollowed`` an existing edge; direct messages go
   mostly between users who follow each other; ``message_read`` is written by the recipient of an
   earlier message once a log-normal reading delay has passed (a read slot with nothing due
   writes a post instead).
3. Clocks: the server clock (``received_time``) is simulated from a fixed epoch, so the output is
   reproducible from the seed (``realtime=True``: the wall clock at produce time). Each device has
   a clock offset (normal, sd ``skew_sd_ms``; ``large_skew_share`` of devices minutes off).
   ``device_time <= sent_time`` (same device clock) and ``received_time = sent_time - offset +
   network delay``. Devices in ``offline_share`` sometimes go offline for minutes to hours: their
   events are buffered and flushed in order when they come back (or at the end of the run), with
   old ``device_time`` and ``sent_time``/``received_time`` at the flush, as the contract's
   corrected event time expects.
4. Injected: ``invalid_share`` of all records are invalid (one of ``INVALID_KINDS``, each with the
   reason the speed layer must quarantine it with), ``duplicate_share`` are exact re-sends of a
   recent valid record (same key, same bytes).
5. Erasures (``erasure_share``, 0 by default, so runs without it are unchanged): that share of the
   activity slots erases its actor (``user_erased``, drawn from a random stream of its own).
   Erased users keep turning up (buffered offline events, messages to them, a second erasure):
   every later record keyed by an erased user is yielded with ``"user_erased"``, the reason the
   speed layer rejects it with; messages they sent earlier stay valid (docs/views.md, "Erasure").

Hot path: draws happen per chunk with numpy; per event only a dict, ``orjson.dumps`` and
``Producer.produce`` remain. ``generate`` is broker-free; ``produce`` writes to Kafka.
"""

from __future__ import annotations

import argparse
import heapq
import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import orjson

import contract
from app_sim import graph
from contract.ids import MAX_WORKER_ID, EventIds, Snowflake
from contract.keys import KeyStore, Sealer
from contract.writers import WriterIdUnavailable
from infra.cli import command_name, run_main
from infra.clients import Kafka

SIM_EPOCH_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: start of the simulated server clock
# Worker bits of records that no one writes to a log as they are (``generate``, ``pattern_events``):
# ``produce`` and ``inject`` write with a worker id allocated from the log's registry (contract.writers).
BROKER_FREE_WORKER_ID = 0

# Activity shares (the bootstrap registrations and follow graph come first, outside the mix).
DEFAULT_MIX: dict[str, float] = {
    "post_created": 0.52,
    "message_sent": 0.16,
    "message_read": 0.12,
    "followed": 0.07,
    "status_updated": 0.06,
    "post_deleted": 0.04,
    "unfollowed": 0.03,
}

# Injected invalid kinds and the reason each must be quarantined with.
INVALID_KINDS: dict[str, str] = {
    "bad_json": "bad_json",
    "unknown_type": "unknown_type",
    "missing_field": "missing_field:text",
    "mistyped_field": "mistyped_field:followee_id",
    "self_follow": "self_follow",
    "text_too_long": "text_too_long:text",
    "not_own_post": "not_own_post",
    "not_in_inbox": "not_in_inbox",
}
DUPLICATE = "duplicate"

_WORDS = (
    "the a kafka log event stream spark delta redis replay state timeline inbox follow post "
    "today really great new just love time people know think good day see make back now "
    "coffee morning weekend launch team data late build ship test green red fast slow"
).split()


@dataclass(frozen=True)
class GeneratorConfig:
    """How the simulated network looks and behaves; every field has a CLI flag."""

    users: int = 1000
    seed: int = 0
    mean_followers: float = 75.0
    mix: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    invalid_share: float = 0.0
    duplicate_share: float = 0.0
    offline_share: float = 0.05  # devices that sometimes go offline
    offline_start_prob: float = 0.05  # per event of such a device: chance it goes offline now
    offline_median_ms: float = 10 * 60_000  # log-normal offline durations: minutes to hours
    skew_sd_ms: float = 20_000
    large_skew_share: float = 0.05
    large_skew_sd_ms: float = 5 * 60_000
    read_median_ms: float = 30_000  # log-normal delay before a message is read
    read_prob: float = 0.8  # share of messages that get read (if the run lasts long enough)
    mutual_message_share: float = 0.85
    sim_events_per_user_s: float = 0.1  # simulated server clock: users * this events per second
    start_ms: int = SIM_EPOCH_MS
    realtime: bool = False
    # Continuing an earlier run's world (bench phases): the same follower graph from its own seed,
    # and no registrations or follows written again; the activity still comes from ``seed``.
    graph_seed: int | None = None
    emit_bootstrap: bool = True
    # snowflake worker id; None: ``produce`` allocates one from the log's registry (contract.writers),
    # a broker-free run uses BROKER_FREE_WORKER_ID. Only the worker bits of the ids depend on it.
    worker_id: int | None = None
    chunk: int = 8192
    erasure_share: float = 0.0  # share of activity slots that erase their actor (item 5 above)
    erased_users: tuple[int, ...] = ()  # continuing a world: users an earlier run erased

    def bootstrap_events(self) -> int:
        """Registrations plus the initial follow edges (approximate until the graph is drawn)."""
        return self.users + int(round(self.users * min(self.mean_followers, max(self.users - 1, 0))))


@dataclass
class Counts:
    """What a generator run wrote, by category; the speed layer's accounting must match it."""

    records: int = 0
    per_type: dict[str, int] = field(default_factory=dict)  # valid, non-duplicate events by type
    invalid: dict[str, int] = field(default_factory=dict)  # injected invalid records by reason
    duplicates: int = 0
    offline_buffered: int = 0
    follow_edges: int = 0


_T_POST, _T_MSG, _T_READ, _T_FOLLOW, _T_STATUS, _T_DELETE, _T_UNFOLLOW, _T_ERASE = range(8)
ERASED = "user_erased"  # the reason a record keyed by an erased user is rejected with
_TYPE_CODES = {
    "post_created": _T_POST,
    "message_sent": _T_MSG,
    "message_read": _T_READ,
    "followed": _T_FOLLOW,
    "status_updated": _T_STATUS,
    "post_deleted": _T_DELETE,
    "unfollowed": _T_UNFOLLOW,
}


def _text_pool(rng: np.random.Generator, n: int, max_len: int) -> list[str]:
    lengths = np.clip(rng.lognormal(np.log(60), 0.7, n), 5, max_len).astype(int)
    words = np.array(_WORDS)
    out = []
    for length in lengths:
        s = " ".join(words[rng.integers(0, len(words), length // 3 + 1)])
        out.append(s[:length].strip() or "hi")
    return out


class EventGenerator:
    """One deterministic run: ``records()`` yields ``(key, value, injected)`` exactly ``n_events`` times.

    ``value`` is the event dict (or raw bytes for an injected ``bad_json``); ``injected`` is None
    for a valid event, ``"duplicate"``, or the reason an injected invalid record must get.
    ``counts`` is complete once the iterator is exhausted.
    """

    def __init__(self, n_events: int, config: GeneratorConfig | None = None):
        self.n_events = int(n_events)
        self.config = config or GeneratorConfig()
        self.counts = Counts()
        unknown = set(self.config.mix) - set(_TYPE_CODES)
        if unknown:
            raise ValueError(f"mix: unknown activity types {sorted(unknown)}")

    def records(self) -> Iterator[tuple[bytes, dict | bytes, str | None]]:
        """The run in log order: its world drawn from the seed, then the phases of the module docstring."""
        run = _Run(self.n_events, self.config, self.counts)
        self._offsets = run.offsets  # each device's clock offset (ms), by user id
        yield from run.registrations()
        yield from run.follow_graph()
        yield from run.activity()
        yield from run.end_of_run()


class _Run:
    """The state of one run of an :class:`EventGenerator`, updated in log order.

    Built by drawing the world from the seed, in this order (the output depends on it): the
    follower graph, the devices, the users' activity weights, the texts, the injection slots. Each
    phase then draws its randomness a chunk at a time (:meth:`chunks`), and what is valid next
    (a post to delete, an edge to undo, a message to read) depends on what was written before.
    """

    def __init__(self, n_events: int, cfg: GeneratorConfig, counts: Counts):
        self.cfg = cfg
        self.counts = counts
        self.rng = rng = np.random.default_rng(cfg.seed)
        U = self.users = cfg.users
        if U < 2:
            raise ValueError("need at least 2 users")
        pop, edges = self._follower_graph()
        bootstrap = U + len(edges) if cfg.emit_bootstrap else 0
        if bootstrap > n_events:
            raise ValueError(
                f"{n_events} events cannot hold the bootstrap of {U} registrations and {len(edges)} "
                f"follows (mean {cfg.mean_followers}); raise --events or lower --users/--mean-followers"
            )
        counts.follow_edges = len(edges)
        self.activity_slots = n_events - bootstrap
        self._devices()
        self._activity_weights(pop)
        self.texts = _text_pool(rng, 1024, contract.MAX_TEXT_LENGTH)
        self.keys = [str(u).encode() for u in range(U + 1)]
        self.inject = self._injection_slots(n_events)
        self._mix()

        for t in contract.EVENT_TYPES:
            counts.per_type[t] = 0
        worker = BROKER_FREE_WORKER_ID if cfg.worker_id is None else cfg.worker_id
        self.flake = Snowflake(worker)
        # event ids sq:<worker>:<n>, minted as each record is sent (as the API mints them on
        # receipt), so a partition receives each writer's seqs in order: an offline device's
        # buffered events get theirs when it comes back (docs/views.md, "Duplicates")
        self.eid_prefix, self.eid_seq = f"sq:{worker}:", 0
        self.realtime = cfg.realtime
        self.step_ms = 1000.0 / max(cfg.sim_events_per_user_s * U, 1e-9)
        self.sim_now = float(cfg.start_ms)

        # State that decides what is valid next (updated in log order).
        self.edge_list: list[tuple[int, int]] = [(int(a), int(b)) for a, b in edges.tolist()]
        self.edge_set = set(self.edge_list)
        self.mutual = graph.mutual_pairs(edges, U).tolist()
        self.live_posts: list[tuple[int, int]] = []  # (post_id, author)
        self.recent_msgs: list[tuple[int, int]] = []  # (message_id, recipient), last 1024 written
        self.pending_reads: list[tuple[int, int, int]] = []  # heap of (due_ms, message_id, recipient)
        self.recent_valid: list[tuple[bytes, dict]] = []  # ring of written valid records, for duplicates
        self.buffers: dict[int, list[dict]] = {}  # offline device -> buffered events, in order
        self.offline_until: dict[int, int] = {}
        self.flush_heap: list[tuple[int, int]] = []  # (comes back at, user)
        self.erased: set[int] = set(cfg.erased_users)  # users whose user_erased is in the log
        self.erng = np.random.default_rng([cfg.seed, 20]) if cfg.erasure_share > 0 else None

    # -- the world, drawn once ----------------------------------------------------------------------
    def _follower_graph(self) -> tuple[np.ndarray, np.ndarray]:
        """Popularity and the follow edges in the order they are written (``graph_seed``: an earlier world's)."""
        cfg = self.cfg
        grng = self.rng if cfg.graph_seed is None else np.random.default_rng(cfg.graph_seed)
        pop = graph.popularity(cfg.users, grng)
        edges = graph.follower_graph(cfg.users, cfg.mean_followers, grng, popularity_p=pop)
        return pop, edges[grng.permutation(len(edges))]

    def _devices(self) -> None:
        """Each device's clock offset (a few large) and whether it sometimes goes offline (item 3)."""
        cfg, rng, U = self.cfg, self.rng, self.users
        offsets = rng.normal(0.0, cfg.skew_sd_ms, U + 1)
        big = rng.random(U + 1) < cfg.large_skew_share
        offsets[big] = rng.normal(0.0, cfg.large_skew_sd_ms, int(big.sum()))
        offsets[0] = 0
        self.offsets = offsets.astype(np.int64).tolist()
        self.offline_prone = (rng.random(U + 1) < cfg.offline_share).tolist()

    def _activity_weights(self, pop: np.ndarray) -> None:
        """Who acts (heavy-tailed activity) and who is followed (popularity), as CDFs to sample."""
        act = self.rng.lognormal(0.0, 1.0, self.users)
        # Inverse-CDF sampling (rng.choice(p=...) would rebuild the CDF on every chunk).
        self.act_cdf = np.cumsum(act / act.sum())
        self.act_cdf[-1] = 1.0
        self.pop_cdf = np.cumsum(pop)
        self.pop_cdf[-1] = 1.0

    def _injection_slots(self, n_events: int) -> dict[int, str]:
        """Activity slot -> injected kind: exact counts of invalid records and duplicates (item 4)."""
        cfg = self.cfg
        n_inv = int(round(cfg.invalid_share * n_events))
        n_dup = int(round(cfg.duplicate_share * n_events))
        if n_inv + n_dup > self.activity_slots:
            raise ValueError("invalid + duplicate shares exceed the activity part of the run")
        slots = self.rng.permutation(self.activity_slots)[: n_inv + n_dup]
        kinds = list(INVALID_KINDS)
        inject: dict[int, str] = {int(s): kinds[i % len(kinds)] for i, s in enumerate(slots[:n_inv])}
        inject.update({int(s): DUPLICATE for s in slots[n_inv:]})
        return inject

    def _mix(self) -> None:
        mix = self.cfg.mix
        names = list(mix)
        self.mix_p = np.array([mix[t] for t in names], dtype=np.float64)
        self.mix_p /= self.mix_p.sum()
        self.mix_codes = np.array([_TYPE_CODES[t] for t in names])

    # -- randomness and the clock ---------------------------------------------------------------------
    def chunks(self, total: int) -> Iterator[dict[str, list]]:
        """Yield per-chunk pre-drawn randomness as plain lists (cheap to index)."""
        cfg, rng, U = self.cfg, self.rng, self.users
        done = 0
        while done < total:
            c = min(cfg.chunk, total - done)
            yield {
                "dt": rng.exponential(self.step_ms, c).tolist(),
                "net": rng.integers(5, 150, c).tolist(),
                "prep": rng.integers(0, 400, c).tolist(),
                "type": self.mix_codes[rng.choice(len(self.mix_codes), c, p=self.mix_p)].tolist(),
                "actor": (np.searchsorted(self.act_cdf, rng.random(c), side="right") + 1).tolist(),
                "target": (np.searchsorted(self.pop_cdf, rng.random(c), side="right") + 1).tolist(),
                "target2": (np.searchsorted(self.pop_cdf, rng.random(c), side="right") + 1).tolist(),
                "text": rng.integers(0, len(self.texts), c).tolist(),
                "u1": rng.random(c).tolist(),
                "u2": rng.random(c).tolist(),
                "read_delay": rng.lognormal(np.log(cfg.read_median_ms), 1.2, c).astype(np.int64).tolist(),
                "offline_ms": rng.lognormal(np.log(cfg.offline_median_ms), 1.0, c).astype(np.int64).tolist(),
                "other": rng.integers(1, U + 1, c).tolist(),
            }
            done += c

    def clock(self, dt: float) -> int:
        """The server clock of the next record: simulated, ``dt`` ms later (item 3), or the wall clock."""
        if self.realtime:
            return time.time_ns() // 1_000_000
        self.sim_now += dt
        return int(self.sim_now)

    # -- after each record ----------------------------------------------------------------------------
    def rejected(self, ev: dict) -> str | None:
        """``user_erased`` for a record keyed by a user erased earlier in the log."""
        if not self.erased:
            return None
        key_user = ev["recipient_id"] if ev["type"] == "message_sent" else ev["user_id"]
        return ERASED if key_user in self.erased else None

    def settle(
        self, key: bytes, ev: dict, injected: str | None, now: int, read_delay: int, u1: float
    ) -> None:
        self.counts.records += 1
        if injected is None:
            self.after_write(key, ev, now, read_delay, u1)
        else:
            self.counts.invalid[injected] = self.counts.invalid.get(injected, 0) + 1

    def after_write(self, key: bytes, ev: dict, now: int, read_delay: int, u1: float) -> None:
        """Bookkeeping once a valid event is in the log (order matters for later validity)."""
        t = ev["type"]
        self.counts.per_type[t] += 1
        if t == "user_erased":
            self.erased.add(ev["user_id"])
        recent_valid = self.recent_valid
        if len(recent_valid) < 256:
            recent_valid.append((key, ev))
        else:
            recent_valid[int(u1 * 256) % 256] = (key, ev)
        if t == "message_sent":
            m = (ev["message_id"], ev["recipient_id"])
            if len(self.recent_msgs) < 1024:
                self.recent_msgs.append(m)
            else:
                self.recent_msgs[int(u1 * 1024) % 1024] = m
            if u1 < self.cfg.read_prob:
                heapq.heappush(self.pending_reads, (now + read_delay, ev["message_id"], ev["recipient_id"]))

    def eid(self) -> str:
        """The next event id of this run's writer (contract/ids.py: ``sq:<worker id>:<n>``)."""
        self.eid_seq += 1
        return self.eid_prefix + str(self.eid_seq)

    # -- 1. the bootstrap: registrations, then the follower graph ---------------------------------------
    def registrations(self) -> Iterator[tuple[bytes, dict, None]]:
        """``users`` ``user_registered`` events (drawn, clock included, even when not emitted)."""
        emit, keys, offs = self.cfg.emit_bootstrap, self.keys, self.offsets
        clock, after_write, counts = self.clock, self.after_write, self.counts
        u = 0
        for ch in self.chunks(self.users):
            c_dt, c_net, c_prep, c_u1 = ch["dt"], ch["net"], ch["prep"], ch["u1"]
            for i in range(len(c_dt)):
                u += 1
                now = clock(c_dt[i])
                sent = now + offs[u] - c_net[i]
                ev = {
                    "event_id": self.eid(),
                    "type": "user_registered",
                    "schema_version": 1,
                    "user_id": u,
                    "device_time": sent - c_prep[i],
                    "sent_time": sent,
                    "received_time": now,
                    "handle": f"u{u}",
                    "display_name": f"User {u}",
                }
                if emit:
                    yield keys[u], ev, None
                    counts.records += 1
                    after_write(keys[u], ev, now, 0, c_u1[i])

    def follow_graph(self) -> Iterator[tuple[bytes, dict, None]]:
        """A ``followed`` event per edge of the graph, in random order (drawn even when not emitted)."""
        emit, keys, offs, edges = self.cfg.emit_bootstrap, self.keys, self.offsets, self.edge_list
        clock, after_write, counts = self.clock, self.after_write, self.counts
        pos = 0
        for ch in self.chunks(len(edges)):
            c_dt, c_net, c_prep, c_u1 = ch["dt"], ch["net"], ch["prep"], ch["u1"]
            for i in range(len(c_dt)):
                a, b = edges[pos]
                pos += 1
                now = clock(c_dt[i])
                sent = now + offs[a] - c_net[i]
                ev = {
                    "event_id": self.eid(),
                    "type": "followed",
                    "schema_version": 1,
                    "user_id": a,
                    "device_time": sent - c_prep[i],
                    "sent_time": sent,
                    "received_time": now,
                    "followee_id": b,
                }
                if emit:
                    yield keys[a], ev, None
                    counts.records += 1
                    after_write(keys[a], ev, now, 0, c_u1[i])

    # -- 2. activity: the steady mix, with the injected records ---------------------------------------
    def activity(self) -> Iterator[tuple[bytes, dict | bytes, str | None]]:
        """Each slot: devices coming back online first, then an injected record or an action.

        The hot path: the chunk's columns and the methods are bound to locals once per chunk.
        """
        slot = 0
        keys, offs, offline_prone = self.keys, self.offsets, self.offline_prone
        inject, flush_heap = self.inject, self.flush_heap
        clock, action, rejected, settle = self.clock, self._action, self.rejected, self.settle
        for ch in self.chunks(self.activity_slots):
            c_dt, c_net, c_prep = ch["dt"], ch["net"], ch["prep"]
            c_type, c_actor, c_u1, c_read = ch["type"], ch["actor"], ch["u1"], ch["read_delay"]
            for i in range(len(c_dt)):
                now = clock(c_dt[i])
                net = c_net[i]
                u1 = c_u1[i]
                if flush_heap and flush_heap[0][0] <= now:
                    yield from self._flush(now, now, net, c_read[i], u1)
                kind = inject.get(slot)
                slot += 1
                if kind is not None:
                    yield from self._injected(kind, ch, i, now)
                    continue
                t, u, ev = action(c_type[i], c_actor[i], u1, now, ch, i)
                ev["schema_version"] = 1
                sent = now + offs[u] - net
                ev["device_time"] = sent - c_prep[i]
                if offline_prone[u] and self._buffered(ev, u, now, u1, ch["offline_ms"][i]):
                    continue  # its device is offline: sent when it comes back
                ev["event_id"] = self.eid()
                ev["sent_time"] = sent
                ev["received_time"] = now
                k = keys[ev["recipient_id"]] if t == _T_MSG else keys[u]
                inj = rejected(ev)
                yield k, ev, inj
                settle(k, ev, inj, now, c_read[i], u1)

    def _action(
        self, t: int, u: int, u1: float, now: int, ch: dict[str, list], i: int
    ) -> tuple[int, int, dict]:
        """The slot's action: (type code, actor, event without its id and times).

        ``t`` and ``u`` are the slot's draws from the mix and of an actor, ``ch``/``i`` its other
        draws. An erasure draw comes first (item 5); then the mix's type, kept valid by the state: a
        read with nothing due, a delete with no live post, or a follow of two users already followed
        becomes a post, an unfollow with no edge left a follow.
        """
        cfg = self.cfg
        ev = None
        if self.erng is not None and self.erng.random() < cfg.erasure_share:
            t = _T_ERASE
            ev = {"type": "user_erased", "user_id": u}
        elif t == _T_READ:
            if self.pending_reads and self.pending_reads[0][0] <= now:
                _, mid, rcpt = heapq.heappop(self.pending_reads)
                ev = {"type": "message_read", "user_id": rcpt, "message_id": mid}
                u = rcpt
            else:
                t = _T_POST
        elif t == _T_DELETE:
            live_posts = self.live_posts
            if live_posts:
                j = int(u1 * len(live_posts))
                pid, u = live_posts[j]
                live_posts[j] = live_posts[-1]
                live_posts.pop()
                ev = {"type": "post_deleted", "user_id": u, "post_id": pid}
            else:
                t = _T_POST
        elif t == _T_UNFOLLOW:
            edge_list = self.edge_list
            if edge_list:
                j = int(u1 * len(edge_list))
                a, b = edge_list[j]
                edge_list[j] = edge_list[-1]
                edge_list.pop()
                self.edge_set.discard((a, b))
                u = a
                ev = {"type": "unfollowed", "user_id": a, "followee_id": b}
            else:
                t = _T_FOLLOW
        if t == _T_FOLLOW:
            v = ch["target"][i]
            if v == u or (u, v) in self.edge_set:
                v = ch["target2"][i]
            if v == u or (u, v) in self.edge_set:
                t = _T_POST  # already follows both picks: posts instead
            else:
                self.edge_list.append((u, v))
                self.edge_set.add((u, v))
                ev = {"type": "followed", "user_id": u, "followee_id": v}
        elif t == _T_MSG:
            u2, mutual = ch["u2"][i], self.mutual
            if mutual and u2 < cfg.mutual_message_share:
                a, b = mutual[int(u2 / cfg.mutual_message_share * len(mutual)) % len(mutual)]
                u, r = (a, b) if u1 < 0.5 else (b, a)
            else:
                r = ch["other"][i]
                if r == u:
                    r = r % self.users + 1
            ev = {
                "type": "message_sent",
                "user_id": u,
                "message_id": self.flake.next_id(now),
                "recipient_id": r,
                "text": self.texts[ch["text"][i]],
            }
        elif t == _T_STATUS:
            ev = {"type": "status_updated", "user_id": u, "text": self.texts[ch["text"][i]]}
        if t == _T_POST:
            pid = self.flake.next_id(now)
            self.live_posts.append((pid, u))
            ev = {"type": "post_created", "user_id": u, "post_id": pid, "text": self.texts[ch["text"][i]]}
        return t, u, ev

    def _buffered(self, ev: dict, u: int, now: int, u1: float, offline_ms: int) -> bool:
        """Whether an offline-prone device is offline (it may go offline now): then ``ev`` waits in
        its buffer, sent and received when the device comes back (item 3)."""
        back = self.offline_until.get(u)
        if back is None and u1 < self.cfg.offline_start_prob:
            back = now + offline_ms
            self.offline_until[u] = back
            heapq.heappush(self.flush_heap, (back, u))
        if back is None:
            return False
        ev["sent_time"] = None  # stamped at the flush
        ev["received_time"] = None
        self.buffers.setdefault(u, []).append(ev)
        self.counts.offline_buffered += 1
        return True

    def _flush(self, up_to: float, now: int, net: int, read_delay: int, u1: float):
        """Devices back online by ``up_to`` send their buffers, in order, sent and received ``now``."""
        offs = self.offsets
        while self.flush_heap and self.flush_heap[0][0] <= up_to:
            _, fu = heapq.heappop(self.flush_heap)
            for ev in self.buffers.pop(fu, ()):
                ev["event_id"] = self.eid()
                # never before it was made: a device back within a few ms of going offline (the
                # network delay of its send shorter than of its making) would send before it made
                ev["sent_time"] = max(now + offs[fu] - net, ev["device_time"])
                ev["received_time"] = now
                k = contract.record_key(ev)
                inj = self.rejected(ev)
                yield k, ev, inj
                self.settle(k, ev, inj, now, read_delay, u1)
            self.offline_until.pop(fu, None)

    def _injected(self, kind: str, ch: dict[str, list], i: int, now: int):
        """A duplicate (an exact re-send of a recent valid record) or an invalid record (item 4)."""
        counts = self.counts
        if kind == DUPLICATE and self.recent_valid:
            k, ev = self.recent_valid[int(ch["u1"][i] * len(self.recent_valid))]
            yield k, ev, DUPLICATE
            counts.records += 1
            counts.duplicates += 1
            return
        k, value, reason = self._invalid(kind, self.eid(), now, ch["actor"][i], ch["other"][i], ch["net"][i])
        if reason in ("not_own_post", "not_in_inbox"):  # stateful: decided after erasure
            reason = self.rejected(value) or reason
        yield k, value, reason
        counts.records += 1
        counts.invalid[reason] = counts.invalid.get(reason, 0) + 1

    def _invalid(self, kind, eid, now, actor, other, net):
        """One injected invalid record: (key, value, reason it must be quarantined with)."""
        flake, texts, users = self.flake, self.texts, self.users
        u = actor
        sent = now + self.offsets[u] - net
        base = {
            "event_id": eid,
            "type": "post_created",
            "schema_version": 1,
            "user_id": u,
            "device_time": sent - 50,
            "sent_time": sent,
            "received_time": now,
        }
        key = str(u).encode()
        if other == u:
            other = other % users + 1
        if kind == "bad_json":
            ev = {**base, "post_id": flake.next_id(now), "text": texts[0]}
            return key, orjson.dumps(ev)[:-9], INVALID_KINDS[kind]
        if kind == "unknown_type":
            return key, {**base, "type": "post_liked", "post_id": 1}, INVALID_KINDS[kind]
        if kind == "missing_field":
            return key, {**base, "post_id": flake.next_id(now)}, INVALID_KINDS[kind]
        if kind == "mistyped_field":
            return key, {**base, "type": "followed", "followee_id": str(other)}, INVALID_KINDS[kind]
        if kind == "self_follow":
            return key, {**base, "type": "followed", "followee_id": u}, INVALID_KINDS[kind]
        if kind == "text_too_long":
            text = (texts[0] + " ") * (contract.MAX_TEXT_LENGTH // max(len(texts[0]), 1) + 2)
            return key, {**base, "post_id": flake.next_id(now), "text": text}, INVALID_KINDS[kind]
        if kind == "not_own_post":
            pid = flake.next_id(now)  # never created: also not the user's own post
            if self.live_posts:
                pid, author = self.live_posts[(other * 7919) % len(self.live_posts)]
                if author == u:
                    u = author % users + 1
                    key = str(u).encode()
            return key, {**base, "type": "post_deleted", "user_id": u, "post_id": pid}, INVALID_KINDS[kind]
        if kind == "not_in_inbox":
            mid = flake.next_id(now)  # never sent
            if self.recent_msgs:
                mid, rcpt = self.recent_msgs[(other * 7919) % len(self.recent_msgs)]
                if rcpt == u:
                    u = rcpt % users + 1
                    key = str(u).encode()
            return key, {**base, "type": "message_read", "user_id": u, "message_id": mid}, INVALID_KINDS[kind]
        raise ValueError(kind)

    # -- the end of the run ----------------------------------------------------------------------------
    def end_of_run(self) -> Iterator[tuple[bytes, dict, str | None]]:
        """Every device still offline comes back now and sends its buffer."""
        now = self.clock(0.0)
        yield from self._flush(math.inf, now, 20, 0, 0.999)


def generate(
    n_events: int, config: GeneratorConfig | None = None
) -> Iterator[tuple[bytes, dict | bytes, str | None]]:
    """Broker-free: the ``(key, value, injected)`` records of one deterministic run."""
    return EventGenerator(n_events, config).records()


# --- writing to Kafka --------------------------------------------------------------------------------


@dataclass
class Summary:
    topic: str
    events: int
    seconds: float
    events_per_s: float
    bytes: int
    mean_record_bytes: float
    per_type: dict[str, int]
    invalid: dict[str, int]
    duplicates: int
    offline_buffered: int
    follow_edges: int
    delivery_failures: int
    worker_id: int  # the snowflake worker id of the run's ids (allocated, or the config's)

    def as_dict(self) -> dict:
        return asdict(self)

    def render(self) -> str:
        lines = [
            f"{self.events:,} events to {self.topic} in {self.seconds:.1f} s = {self.events_per_s:,.0f} events/s "
            f"(mean record {self.mean_record_bytes:.0f} B, {self.delivery_failures} delivery failures, "
            f"snowflake worker {self.worker_id})",
            "  valid per type: " + ", ".join(f"{t}={n:,}" for t, n in self.per_type.items()),
            f"  injected: duplicates={self.duplicates:,}, invalid="
            + (", ".join(f"{r}={n}" for r, n in sorted(self.invalid.items())) or "0"),
            f"  offline-buffered events: {self.offline_buffered:,}",
        ]
        return "\n".join(lines)


def producer_for(bootstrap: Kafka, on_delivery: Callable | None = None):
    """The project's durable producer (acks=all, idempotent) tuned for throughput (big lz4 batches)."""
    from infra import clients

    return clients.kafka_producer(bootstrap, "app_sim.generator", "throughput", on_delivery=on_delivery)


def produce(
    n_events: int,
    config: GeneratorConfig | None = None,
    *,
    topic: str,
    bootstrap: Kafka,
    rate: float | None = None,
    progress: bool = True,
    pause_at: int | None = None,
    on_pause: Callable[[], None] | None = None,
    sealer: Sealer | None = None,
) -> Summary:
    """Write one generator run to Kafka; returns once every record is acknowledged (or failed).

    With ``pause_at``, the first ``pause_at`` records are flushed (acknowledged) and ``on_pause()``
    runs before the rest is sent: a test can let a consumer take the first part of a run, then the
    rest, with the run's counts still those of one run.

    With ``sealer`` (``contract.keys``; the CLI's default) every personal field is sealed with its
    user's data key as it is sent (``generate`` stays plaintext and reproducible). A duplicate is
    the same dict as its original, so it goes out sealed identically (the same bytes). An erasure
    deletes the user's key once the records before it are acknowledged (at the next progress
    step, or at the end); later records of that user are sealed with a key no one keeps.
    """

    config = config or GeneratorConfig()
    if config.worker_id is None:  # a worker id of its own for the life of the log, before any write
        from contract import writers

        config = replace(config, worker_id=writers.allocate_for(bootstrap, topic, "generator").worker_id)
    gen = EventGenerator(n_events, config)
    if sealer is not None:
        # records of an erased user: sealed with a throwaway key (the caller's sealer left as it is)
        sealer = Sealer(sealer.store, cache=True, shred_erased=True)
        sealer.prepare(range(1, gen.config.users + 1))  # every user's key in one transaction
    seal = sealer.seal if sealer is not None else None
    erasing: list[int] = []  # users erased in the records sent since the last progress step
    erased_at_step: list[int] = []  # ... and in the step before (acknowledged by now: erase keys)
    failures = 0
    first_error: list[str] = []

    def on_delivery(err, _msg):
        nonlocal failures
        if err is not None:
            failures += 1
            if not first_error:
                first_error.append(str(err))

    producer = producer_for(bootstrap, on_delivery)
    send = producer.produce
    poll = producer.poll
    dumps = orjson.dumps
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n_events, unit="ev", unit_scale=True, mininterval=0.5, file=sys.stderr)
    total_bytes = 0
    n = 0
    start = time.perf_counter()
    for key, value, injected in gen.records():
        if n == pause_at and on_pause is not None:
            failures += producer.flush(120)
            on_pause()
        if type(value) is dict:
            if seal is not None:
                seal(value)
                if injected is None and value["type"] == "user_erased":
                    erasing.append(value["user_id"])
            value = dumps(value)
        total_bytes += len(value)
        try:
            send(topic, value, key)
        except BufferError:  # local queue full: let librdkafka drain, then retry once
            poll(0.05)
            while True:
                try:
                    send(topic, value, key)
                    break
                except BufferError:
                    poll(0.05)
        n += 1
        if not n & 0x3FFF:
            poll(0)
            if sealer is not None:
                for u in erased_at_step:
                    sealer.erase(u)
                erased_at_step, erasing = erasing, []
            if bar is not None:
                bar.update(0x4000)
            if rate:
                ahead = n / rate - (time.perf_counter() - start)
                if ahead > 0:
                    time.sleep(ahead)
        elif rate and not n & 0x3F:
            ahead = n / rate - (time.perf_counter() - start)
            if ahead > 0:
                time.sleep(ahead)
    remaining = producer.flush(120)
    elapsed = time.perf_counter() - start
    if sealer is not None:
        for u in erased_at_step + erasing:
            sealer.erase(u)
    if bar is not None:
        bar.update(n - bar.n)
        bar.close()
    failures += remaining
    c = gen.counts
    summary = Summary(
        topic=topic,
        events=n,
        seconds=round(elapsed, 3),
        events_per_s=round(n / elapsed, 1) if elapsed else 0.0,
        bytes=total_bytes,
        mean_record_bytes=round(total_bytes / n, 1) if n else 0.0,
        per_type=dict(c.per_type),
        invalid=dict(c.invalid),
        duplicates=c.duplicates,
        offline_buffered=c.offline_buffered,
        follow_edges=c.follow_edges,
        delivery_failures=failures,
        worker_id=config.worker_id,
    )
    if first_error:
        print(f"first delivery error: {first_error[0]}", file=sys.stderr)
    return summary


# --- alert patterns on demand (the analytics' rules, pipelines/analytics/rules.py) -------------------

PATTERNS = ("burst", "follow_churn", "message_flood")


def pattern_events(
    pattern: str,
    *,
    user: int,
    now_ms: int,
    burst_posts: int,
    churn_repeats: int,
    churn_within_s: int,
    flood_recipients: int,
    worker_id: int = BROKER_FREE_WORKER_ID,
    event_ids: EventIds | None = None,
) -> list[dict]:
    """The valid events of one alert pattern by ``user``, ending at ``now_ms`` (server clock).

    Each crosses its rule's threshold with a margin and fits well inside the rule's window:
    ``burst``: ``burst_posts + 2`` posts 200 ms apart; ``follow_churn``: ``churn_repeats + 1``
    follows each undone 1 s later (never more than ``churn_within_s``); ``message_flood``:
    messages to ``flood_recipients + 2`` distinct users 100 ms apart. Device clocks are exact.
    Post and message ids are snowflakes of ``worker_id`` (``inject`` passes an allocated one);
    event ids come from ``event_ids`` (one writer's count: ``inject`` passes one for all its
    patterns), by default a count of ``worker_id`` from 1.
    """
    flake = Snowflake(worker_id)
    others = [u for u in range(1, flood_recipients + churn_repeats + 8) if u != user]
    if pattern == "burst":
        steps = [("post_created", {"text": f"burst {i}"}) for i in range(burst_posts + 2)]
        gap = 200
    elif pattern == "follow_churn":
        assert churn_within_s >= 1, "an unfollow 1 s after its follow must count as churn"
        steps = []
        for v in others[: churn_repeats + 1]:
            steps += [("followed", {"followee_id": v}), ("unfollowed", {"followee_id": v})]
        gap = 1000
    elif pattern == "message_flood":
        steps = [
            ("message_sent", {"recipient_id": r, "text": "hello"}) for r in others[: flood_recipients + 2]
        ]
        gap = 100
    else:
        raise ValueError(f"unknown pattern {pattern!r}; known: {PATTERNS}")
    ids = (event_ids or EventIds(worker_id)).take(len(steps))
    out = []
    for i, (etype, fields) in enumerate(steps):
        t = now_ms - (len(steps) - 1 - i) * gap
        ev = {"event_id": ids[i], "type": etype, "schema_version": 1, "user_id": user, **fields}
        if etype == "post_created":
            ev["post_id"] = flake.next_id(t)
        elif etype == "message_sent":
            ev["message_id"] = flake.next_id(t)
        ev.update(device_time=t, sent_time=t, received_time=t)
        out.append(ev)
    return out


def inject(
    patterns: list[str],
    *,
    topic: str,
    bootstrap: Kafka,
    user: int,
    settings=None,
    worker_id: int | None = None,
) -> int:
    """Append the events of each pattern (thresholds from the settings) to ``topic``; returns how many.

    The ids are snowflakes of ``worker_id``; None (the default): one allocated for this call from
    the log's registry (contract.writers), so an injection never reuses a generator run's ids.
    """

    from infra.settings import get_settings

    s = settings or get_settings()
    if worker_id is None:
        from contract import writers

        worker_id = writers.allocate_for(bootstrap, topic, "inject", settings).worker_id
    producer = producer_for(bootstrap)
    eids = EventIds(worker_id)
    n = 0
    window_s = {
        "burst": s.rule_burst_window_s / 2,
        "follow_churn": s.rule_churn_window_s,
        "message_flood": s.rule_flood_window_s,
    }
    span_s = {  # first to last event of each pattern (see pattern_events)
        "burst": (s.rule_burst_posts + 1) * 0.2,
        "follow_churn": 2 * (s.rule_churn_repeats + 1) - 1.0,
        "message_flood": (s.rule_flood_recipients + 1) * 0.1,
    }
    for pattern in patterns:
        # the pattern ends now; wait until it fits in one window of its rule (no boundary inside)
        if time.time() % window_s[pattern] < span_s[pattern] + 0.1:
            time.sleep(span_s[pattern] + 0.2 - time.time() % window_s[pattern])
        for ev in pattern_events(
            pattern,
            user=user,
            now_ms=time.time_ns() // 1_000_000,
            burst_posts=s.rule_burst_posts,
            churn_repeats=s.rule_churn_repeats,
            churn_within_s=s.rule_churn_within_s,
            flood_recipients=s.rule_flood_recipients,
            worker_id=worker_id,
            event_ids=eids,
        ):
            producer.produce(topic, orjson.dumps(ev), contract.record_key(ev))
            n += 1
    if producer.flush(60):
        raise RuntimeError("injected pattern events were not all acknowledged within 60 s")
    return n


def main(argv: list[str] | None = None) -> int:
    from infra.settings import get_settings

    settings = get_settings()
    d = GeneratorConfig()
    p = argparse.ArgumentParser(prog=command_name("app_sim.generator"), description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=200_000, help="records to write in total (default 200000)")
    p.add_argument("--users", type=int, default=d.users)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--mean-followers", type=float, default=d.mean_followers)
    p.add_argument("--topic", default=settings.events_topic)
    p.add_argument("--bootstrap", default=settings.kafka_bootstrap)
    p.add_argument("--rate", type=float, default=None, help="pace production to this many events/s")
    p.add_argument("--invalid-share", type=float, default=d.invalid_share)
    p.add_argument("--duplicate-share", type=float, default=d.duplicate_share)
    p.add_argument("--offline-share", type=float, default=d.offline_share)
    p.add_argument(
        "--erasure-share",
        type=float,
        default=d.erasure_share,
        help="share of activity slots erasing their actor",
    )
    p.add_argument(
        "--worker-id",
        type=int,
        default=None,
        help="snowflake worker id (0-1023) of the run and of --inject; default: allocate one of its own from "
        "the log's registry (contract/writers.py). Fixed only to check reproducibility: it bypasses the "
        "registry, so ids may collide with another writer's",
    )
    p.add_argument(
        "--realtime", action="store_true", help="received_time = wall clock at produce (freshness runs)"
    )
    p.add_argument(
        "--inject",
        action="append",
        choices=PATTERNS,
        help="after the run, append this alert pattern (repeatable; with --events 0, only the patterns)",
    )
    p.add_argument("--inject-user", type=int, default=1, help="the user who acts out the patterns")
    p.add_argument(
        "--no-seal",
        action="store_true",
        help="write personal fields in plaintext (default: sealed with per-user keys unless "
        "SOCIAL_SEAL_PERSONAL_DATA=0; docs/erasure.md)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    if a.worker_id is not None and not 0 <= a.worker_id <= MAX_WORKER_ID:
        p.error(f"--worker-id must be in 0..{MAX_WORKER_ID}")
    try:
        return _run(a, settings)
    except WriterIdUnavailable as exc:  # refuse to start: one line, no traceback
        print(f"generator: {exc}", file=sys.stderr)
        return 2


def _run(a: argparse.Namespace, settings) -> int:
    config = GeneratorConfig(
        users=a.users,
        seed=a.seed,
        mean_followers=a.mean_followers,
        invalid_share=a.invalid_share,
        duplicate_share=a.duplicate_share,
        offline_share=a.offline_share,
        erasure_share=a.erasure_share,
        worker_id=a.worker_id,
        realtime=a.realtime,
    )
    failures = 0
    if a.events:
        sealer = None
        if settings.seal_personal_data and not a.no_seal:
            sealer = Sealer(KeyStore.for_settings(replace(settings, events_topic=a.topic)))
        summary = produce(
            a.events,
            config,
            topic=a.topic,
            bootstrap=replace(settings, kafka_bootstrap=a.bootstrap),
            rate=a.rate,
            progress=not a.no_progress,
            sealer=sealer,
        )
        failures = summary.delivery_failures
        print(
            orjson.dumps(summary.as_dict(), option=orjson.OPT_INDENT_2).decode()
            if a.json
            else summary.render()
        )
    if a.inject:
        n = inject(
            a.inject,
            topic=a.topic,
            bootstrap=replace(settings, kafka_bootstrap=a.bootstrap),
            user=a.inject_user,
            settings=settings,
            worker_id=a.worker_id,
        )
        print(f"injected {n} events: {', '.join(a.inject)} by user {a.inject_user}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(run_main(main, "app_sim.generator"))
