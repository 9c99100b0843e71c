"""The grammar of contract-valid logs with the hostile classes, as a Hypothesis strategy.

A :class:`Log` is a list of Kafka records in produce order, each in the partition of its record
key (the contract's partition key, docs/events.md); users are assigned to partitions at random,
so follower and followee often live in different partitions. What :func:`logs` draws, each
class on purpose:

- ids reused across owners (post and message ids from a small pool shared by every user, when
  ``cross_owner_ids``), and by the same owner (``reused_id``);
- deletes, reads and unfollows before their creates, deletes of other users' posts, second
  deletes, reads by someone other than the recipient;
- duplicate ``event_id`` within a partition (a resend, at the dedup window's edges: exactly the
  window later and one millisecond more) and across partitions (an id put on a new event);
- event ids of both forms (docs/views.md, "Duplicates"): opaque, and sequenced ``sq:<w>:<seq>``
  of a few writers, with seqs skipped (sent to other partitions), held back and sent late (within
  the reorder window R and beyond it), a writer restarted (a new writer id; its old ids resent),
  a seq at the top of the range, and near-misses of the form that are opaque (leading zeros,
  16 digits, seq 0, a non-ASCII digit, a trailing newline);
- follow, unfollow and refollow racing the followee's posts (the ``race`` burst);
- timelines at the cap (small N, ``burst`` of posts) with deletes and unfollows that need a refill;
- authors crossing the fan-out threshold both ways (small T, many follows and unfollows, erasures);
- erasure in the middle of a log, with events keyed by the erased user after it, and events of
  other partitions naming them;
- clock skew and offline devices at the edges of the contract's window (valid at the edge,
  quarantined one millisecond beyond);
- quarantined records between valid ones (every shape of docs/events.md's reason list that a
  producer can write);
- with ``late``: a hand-written copy received more than the dedup grace behind its partition's
  newest record (the speed layer may have forgotten its id; the batch layer never forgets, a
  known and documented difference, so the Spark comparison leaves this class out).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from hypothesis import strategies as st

T0 = 1_780_000_000_000  # 2026-05-28
H = 3_600_000
WINDOW_MS = 24 * H  # the dedup window (infra/settings.py DEDUP_WINDOW_MS)
GRACE_MS = H  # the dedup grace
REORDER = 4  # the reorder window R of sequenced ids (small, so logs of 60 records cross it)
ID_FORMS = [
    "opaque",
    "seq",
    "seq",
    "seq",
    "seq",
    "seq",
    "skip",
    "late_seq",
    "late_seq",
    "restart",
    "odd",
    "top",
]
ODD_IDS = ["sq:01:5", "sq:1:0", "sq:1:05", "sq:1:" + "9" * 16, "SQ:1:5", "sq:1:5\n", "sq:1:\u0663", "sq::5"]
MAX_SKEW = 86_400_000  # docs/events.md x-clock-window
MAX_OFFLINE = 2_592_000_000
KEY_FIELD = {"message_sent": "recipient_id"}
TIME_FIELDS = ("device_time", "sent_time", "received_time")
TIME_STRIDE = 120 * 24 * H  # relabel: example k's clock k * 120 days on (a log spans far less)
WRITER_STRIDE = 10**12  # relabel: example k's writers k * 10^12 on
ID_FIELDS = ("user_id", "followee_id", "recipient_id", "post_id", "message_id")


@dataclass(frozen=True)
class Rec:
    partition: int
    key: str
    value: dict | bytes | None  # a dict is written as JSON

    def raw(self) -> bytes | None:
        if isinstance(self.value, dict):
            return json.dumps(self.value).encode()
        return self.value


@dataclass
class Log:
    partitions: int
    users: list[int]
    records: list[Rec] = field(default_factory=list)

    def per_partition(self) -> dict[int, list[bytes | None]]:
        out: dict[int, list[bytes | None]] = {p: [] for p in range(self.partitions)}
        for r in self.records:
            out.setdefault(r.partition, []).append(r.raw())
        return out

    def relabel(self, k: int, id_stride: int = 10_000, partition_stride: int = 4) -> Log:
        """The same log in example k's own id space, partitions, writers and time: many examples
        in one topic, which the batch layer's test folds into 4 partitions, example after example
        (so example k's records come after, and are received after, every record of example k-1:
        the partition's newest received_time before a record of k is k's own)."""

        def ids(v):
            if not isinstance(v, dict):
                return v
            v = dict(v)
            for f in ID_FIELDS:
                if isinstance(v.get(f), int) and not isinstance(v[f], bool) and v[f] >= 1:
                    v[f] = v[f] + k * id_stride
            eid = v.get("event_id")
            if isinstance(eid, str) and eid:
                seq = re.fullmatch(r"sq:(0|[1-9][0-9]{0,14}):([1-9][0-9]{0,14})", eid)
                if seq and int(seq.group(1)) < WRITER_STRIDE:  # the example's own writers
                    v["event_id"] = f"sq:{int(seq.group(1)) + k * WRITER_STRIDE}:{seq.group(2)}"
                else:
                    v["event_id"] = f"x{k}-{eid}"
            times = [v.get(f) for f in TIME_FIELDS]
            if all(type(t) is int and T0 - 2 * MAX_OFFLINE <= t <= T0 + TIME_STRIDE for t in times):
                v.update({f: t + k * TIME_STRIDE for f, t in zip(TIME_FIELDS, times, strict=True)})
            return v

        recs = [
            Rec(
                r.partition + k * partition_stride,
                str(int(r.key) + k * id_stride) if r.key.isdigit() else r.key,
                ids(r.value),
            )
            for r in self.records
        ]
        return Log(self.partitions, [u + k * id_stride for u in self.users], recs)

    def describe(self) -> str:
        """The log as Python literals, one record a line (a failing example, ready to paste)."""
        lines = [f"Log(partitions={self.partitions}, users={self.users}, records=["]
        lines += [f"    {r!r}," for r in self.records]
        return "\n".join(lines + ["])"])


CLOCK_MODES = ["sync", "sync", "sync", "delay", "skew_ahead", "skew_behind", "offline_edge", "offline_some"]
STEPS = [0, 0, 1, 1000, 1000, 60_000, H, 25 * H]
KINDS = [
    "post",
    "post",
    "follow",
    "follow",
    "follow",
    "follow",
    "unfollow",
    "unfollow",
    "delete",
    "message",
    "read",
    "register",
    "status",
    "resend",
    "reuse_event_id",
    "invalid",
    "race",
    "burst",
    "fans",
    "twins",
    "erase",
]
INVALID = [
    "bad_json",
    "not_utf8",
    "tombstone",
    "not_an_object",
    "no_type",
    "unknown_type",
    "unknown_field",
    "missing_field",
    "bad_schema_version",
    "mistyped",
    "bad_value",
    "text_too_long",
    "self_follow",
    "skew_over",
    "offline_over",
    "device_after_sent",
]


@st.composite
def logs(
    draw,
    *,
    min_records: int = 2,
    max_records: int = 60,
    cross_owner_ids: bool = True,
    late: bool = False,
    max_partitions: int = 4,
) -> Log:
    n_users = draw(st.integers(3, 8), label="users")
    users = list(range(1, n_users + 1))
    partitions = draw(st.integers(2, max_partitions), label="partitions")
    part_of = {u: draw(st.integers(0, partitions - 1)) for u in users}
    target = draw(st.integers(min_records, max_records), label="records")
    log = Log(partitions, users)
    valid: list[Rec] = []  # contract-valid records so far (to resend or to take an id from)
    posts: list[tuple[int, int]] = []
    messages: list[tuple[int, int]] = []
    state = {"clock": T0, "eid": 0, "erasures": 0, "writer": draw(st.sampled_from([0, 7])), "seq": 0}
    held: list[tuple[int, int]] = []  # (writer, seq) skipped, to be sent late
    kinds = KINDS + (["late"] if late else [])

    def user():
        return draw(st.sampled_from(users))

    def other(u):
        return draw(st.sampled_from([v for v in users if v != u]))

    def post_id(author):
        k = draw(st.integers(1, 8))
        return k if cross_owner_ids else author * 100 + k

    def message_id(recipient):
        k = draw(st.integers(1, 5))
        return k if cross_owner_ids else recipient * 100 + k

    def times(mode: str) -> tuple[int, int, int]:
        rt = state["clock"]
        if mode == "sync":
            return rt, rt, rt
        if mode == "delay":
            st_ = rt - draw(st.integers(0, 2000))
            return st_, st_, rt
        if mode == "skew_ahead":  # the device clock a full window ahead: still valid
            return rt + MAX_SKEW, rt + MAX_SKEW, rt
        if mode == "skew_behind":
            return rt - MAX_SKEW, rt - MAX_SKEW, rt
        if mode == "offline_edge":  # held offline exactly as long as the contract allows
            return rt - MAX_OFFLINE, rt, rt
        if mode == "offline_some":
            return rt - draw(st.integers(1, MAX_OFFLINE)), rt, rt
        if mode == "skew_over":
            return rt + MAX_SKEW + 1, rt + MAX_SKEW + 1, rt
        if mode == "offline_over":
            return rt - MAX_OFFLINE - 1, rt, rt
        if mode == "device_after_sent":
            return rt + 1, rt, rt
        raise ValueError(mode)

    def event_id() -> str:
        form = draw(st.sampled_from(ID_FORMS))
        if form == "opaque":
            state["eid"] += 1
            return f"e{state['eid']}"
        if form == "odd":
            return draw(st.sampled_from(ODD_IDS))
        if form == "late_seq" and held:  # the one held last (at the window's edges), or any
            w, s = held.pop(draw(st.sampled_from([len(held) - 1, 0])))
            return f"sq:{w}:{s}"
        if form == "top":  # the highest seq of the form: every later seq of the writer is below it
            return f"sq:{state['writer']}:{10**15 - 1}"
        if form == "restart":  # a restarted writer: a new writer id, counting from 1
            state["writer"] += draw(st.sampled_from([1, 10**9]))
            state["seq"] = 0
        if form == "skip":  # seqs that went elsewhere or are held back: one of them sent late
            k = draw(st.sampled_from([2, REORDER, REORDER + 1, REORDER + 2, 3 * REORDER]))
            # the first skipped is the highest seq minus k once this event is sent: with k = R + 1 at
            # the reorder window's lower edge (a duplicate), the second just inside it
            held.append((state["writer"], state["seq"] + draw(st.sampled_from([1, 2, k - 1]))))
            state["seq"] += k - 1
        state["seq"] += 1
        return f"sq:{state['writer']}:{state['seq']}"

    def make(type_, u, mode=None, **fields) -> dict:
        dt, st_, rt = times(mode or draw(st.sampled_from(CLOCK_MODES)))
        return {
            "event_id": event_id(),
            "type": type_,
            "schema_version": 1,
            "user_id": u,
            "device_time": dt,
            "sent_time": st_,
            "received_time": rt,
            **fields,
        }

    def emit(ev: dict | bytes | None, key_user: int | None = None, is_valid: bool = True) -> None:
        if isinstance(ev, dict) and key_user is None:
            key_user = ev.get(KEY_FIELD.get(ev.get("type"), "user_id"))
        if key_user not in part_of:
            key_user = user()
        rec = Rec(part_of[key_user], str(key_user), ev)
        log.records.append(rec)
        if is_valid:
            valid.append(rec)
            if ev["type"] == "post_created":
                posts.append((ev["user_id"], ev["post_id"]))
            if ev["type"] == "message_sent":
                messages.append((ev["recipient_id"], ev["message_id"]))

    def text():
        return draw(st.sampled_from(["", "hi", "x" * 280, "héllo ✓", "a b"]))

    def a_post(author, **kw):
        emit(make("post_created", author, post_id=post_id(author), text=text(), **kw))

    def follow_event(type_, u, f):
        emit(make(type_, u, followee_id=f))

    def invalid():
        shape = draw(st.sampled_from(INVALID))
        u = user()
        base = make("post_created", u, mode="sync", post_id=post_id(u), text="t")
        if shape == "bad_json":
            emit(b'{"type": "post_created", ', u, False)
        elif shape == "not_utf8":
            emit(b"\xff\xfe\x00garbage", u, False)
        elif shape == "tombstone":
            emit(None, u, False)
        elif shape == "not_an_object":
            emit(b"[1, 2, 3]", u, False)
        elif shape == "no_type":
            emit({k: v for k, v in base.items() if k != "type"}, u, False)
        elif shape == "unknown_type":
            emit({**base, "type": "post_liked"}, u, False)
        elif shape == "unknown_field":
            emit({**base, "colour": "red"}, u, False)
        elif shape == "missing_field":
            emit({k: v for k, v in base.items() if k != "post_id"}, u, False)
        elif shape == "bad_schema_version":
            emit({**base, "schema_version": 2}, u, False)
        elif shape == "mistyped":
            emit({**base, "post_id": str(base["post_id"])}, u, False)
        elif shape == "bad_value":
            emit({**base, "post_id": 0}, u, False)
        elif shape == "text_too_long":
            emit({**base, "text": "y" * 281}, u, False)
        elif shape == "self_follow":
            emit(make(draw(st.sampled_from(["followed", "unfollowed"])), u, followee_id=u), u, False)
        else:  # the clock window, one millisecond beyond its edges
            emit(make("followed", u, mode=shape, followee_id=other(u)), u, False)

    def resend(src: Rec, rt: int) -> dict:
        """The same event sent again (same event_id), received at ``rt``."""
        e = dict(src.value)
        delta = rt - e["received_time"]
        e["received_time"], e["sent_time"] = rt, e["sent_time"] + delta
        if e["sent_time"] - e["device_time"] > MAX_OFFLINE:
            e["device_time"] += delta
        return e

    while len(log.records) < target:
        state["clock"] += draw(st.sampled_from(STEPS))
        kind = draw(st.sampled_from(kinds))
        if kind == "post":
            a_post(user())
        elif kind in ("follow", "unfollow"):
            u = user()
            follow_event("followed" if kind == "follow" else "unfollowed", u, other(u))
        elif kind == "delete":
            u = user()
            choice = draw(st.sampled_from(["own", "any", "fresh"]))
            own = [p for a, p in posts if a == u]
            if choice == "own" and own:
                pid = draw(st.sampled_from(own))
            elif choice == "any" and posts:
                pid = draw(st.sampled_from(posts))[1]
            else:
                pid = post_id(u)  # maybe before its create, maybe never created
            emit(make("post_deleted", u, post_id=pid))
        elif kind == "message":
            s, r = user(), user()
            emit(make("message_sent", s, message_id=message_id(r), recipient_id=r, text=text()))
        elif kind == "read":
            r = user()
            mine = [m for rr, m in messages if rr == r]
            choice = draw(st.sampled_from(["mine", "any", "fresh"]))
            if choice == "mine" and mine:
                mid = draw(st.sampled_from(mine))
            elif choice == "any" and messages:
                mid = draw(st.sampled_from(messages))[1]
            else:
                mid = message_id(r)  # maybe before it arrives
            emit(make("message_read", r, message_id=mid))
        elif kind == "register":
            u = user()
            handle = draw(st.sampled_from(["ann", "bob_2", "C" * 15, "dee"]))
            name = draw(st.sampled_from(["Ann", "Bob B.", "é" * 50]))
            emit(make("user_registered", u, handle=handle, display_name=name))
        elif kind == "status":
            emit(make("status_updated", user(), text=text()))
        elif kind == "resend" and valid:
            src = draw(st.sampled_from(valid))
            when = draw(st.sampled_from(["now", "window_edge", "past_window"]))
            rt0 = src.value["received_time"]
            rt = {"now": state["clock"], "window_edge": rt0 + WINDOW_MS, "past_window": rt0 + WINDOW_MS + 1}[
                when
            ]
            rt = max(rt, state["clock"])
            state["clock"] = rt
            emit(resend(src, rt))
        elif kind == "reuse_event_id" and valid:
            # a new event (any partition: maybe the same one, maybe another) with an old event_id
            src = draw(st.sampled_from(valid))
            u = user()
            ev = make("followed", u, followee_id=other(u)) if draw(st.booleans()) else None
            if ev is None:
                ev = make("post_created", u, post_id=post_id(u), text="again")
            ev["event_id"] = src.value["event_id"]
            emit(ev)
        elif kind == "invalid":
            invalid()
        elif kind == "race":
            # follow / unfollow / refollow of f by u, with f posting in its own partition between
            u = user()
            f = other(u)
            follow_event("followed", u, f)
            a_post(f)
            follow_event("unfollowed", u, f)
            a_post(f)
            follow_event("followed", u, f)
        elif kind == "burst":
            a = user()
            for _ in range(draw(st.integers(2, 5))):
                state["clock"] += draw(st.sampled_from([0, 1, 1000]))
                a_post(a)
        elif kind == "twins":  # two authors, one post id, one instant: ties broken by author
            a = user()
            b = other(a)
            k = draw(st.integers(1, 8))
            for x in (a, b):
                emit(
                    make(
                        "post_created",
                        x,
                        mode="sync",
                        post_id=k if cross_owner_ids else x * 100 + k,
                        text="t",
                    )
                )
        elif kind == "fans":  # an author gains followers: over the fan-out threshold
            a = user()
            for f in draw(
                st.lists(st.sampled_from([v for v in users if v != a]), min_size=2, max_size=4, unique=True)
            ):
                follow_event("followed", f, a)
        elif kind == "erase" and state["erasures"] < 2 and len(log.records) > target // 3:
            state["erasures"] += 1
            emit(make("user_erased", user()))
        elif kind == "late" and valid:
            # a copy received within the window of its original but more than the grace behind
            # its partition's newest record: the speed layer has forgotten the id
            src = draw(st.sampled_from(valid))
            rt0 = src.value["received_time"]
            filler_key = int(src.key)
            state["clock"] = max(state["clock"], rt0 + WINDOW_MS + GRACE_MS + 2)
            emit(make("status_updated", filler_key, mode="sync", text="filler"))
            emit(resend(src, rt0 + WINDOW_MS))
    return log
