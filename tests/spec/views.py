"""docs/views.md as a small executable specification, in plain Python.

It shares no code with the speed layer (``pipelines/speed``), the replay or the batch layer
(``pipelines/batch_layer``), and imports nothing of ``pipelines`` or ``app_sim``: the event
contract is read as data from ``contract/events.v1.schema.json`` and the rules below are
written from docs/events.md, docs/views.md, docs/architecture.md ("Dedup") and the identity rule:

- a post is ``(author_id, post_id)``, a message ``(recipient_id, message_id)``; two owners may use
  the same id: two different things;
- a ``post_created`` of an ``(author, post)`` created before (live or deleted): ``reused_id``;
  a ``post_deleted`` of an ``(actor, post)`` never created: ``not_own_post``, already deleted:
  ``post_already_deleted``; a ``message_sent`` of a ``(recipient, message)`` already in that
  inbox: ``reused_id``; a ``message_read`` of ``(reader, message)`` not in the reader's inbox
  (yet): ``not_in_inbox``;
- dedup per partition, with "newest" the partition's newest received_time before this record and
  "the bound" newest minus window minus grace:
  - a sequenced ``event_id`` ``sq:<writer>:<seq>`` (canonical decimal, at most 15 digits each) is
    a duplicate when the writer's current run in the partition already holds that seq, or when
    the seq is at or below the highest seq of that run minus R (the reorder window). A run is the
    writer's records since its first here, or since one whose writer had no record at or after
    the bound (the run before it is forgotten);
  - any other ``event_id`` seen before in the same partition with a received_time at least this
    one's minus the window is a duplicate; an id is forgotten once its newest received_time is
    older than the bound;
- erasure: an event keyed by a user erased earlier in its partition is rejected ``user_erased``;
  every view leaves the erased users out (messages they sent anonymised: sender 0, no text);
- home timeline(u): the live posts by u or by follows(u), newest first by corrected event time,
  ties by post_id then author_id, descending; the latest N (as users read it: stored part and
  read-time merge together, so the fan-out threshold does not change what is read).

Input: a log, ``{partition: [value bytes (or None), ...]}`` in offset order (keys are not needed:
a record's partition is where the log put it). :func:`evaluate` returns :class:`Outcome`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "contract" / "events.v1.schema.json"

APPLIED, DUPLICATE, REJECTED, QUARANTINED = "applied", "duplicate", "rejected", "quarantined"
INT64_MAX = 2**63 - 1


# ------------------------------------------------------------------------------------------------
# The contract, read as data
# ------------------------------------------------------------------------------------------------
@dataclass
class Contract:
    types: list[str]
    envelope_required: list[str]
    envelope_props: dict
    type_required: dict[str, list[str]]
    type_props: dict[str, dict]
    partition_key: dict[str, str]
    defs: dict
    max_skew: int
    max_offline: int


def load_contract(path: Path = SCHEMA_PATH) -> Contract:
    s = json.loads(path.read_text())
    defs = s["$defs"]
    env = defs["envelope"]
    types = list(s["properties"]["type"]["enum"])
    window = env["x-clock-window"]
    return Contract(
        types=types,
        envelope_required=list(env["required"]),
        envelope_props=env["properties"],
        type_required={t: list(defs[t].get("required", [])) for t in types},
        type_props={
            t: {k: v for k, v in defs[t].get("properties", {}).items() if k != "type"} for t in types
        },
        partition_key={t: defs[t]["x-partition-key"] for t in types},
        defs=defs,
        max_skew=window["max_clock_skew_ms"],
        max_offline=window["max_offline_ms"],
    )


CONTRACT = load_contract()


def _resolve(spec: dict) -> dict:
    """A property's schema with its $ref followed (one level, as the contract uses them)."""
    if "$ref" in spec:
        return {
            **CONTRACT.defs[spec["$ref"].rsplit("/", 1)[1]],
            **{k: v for k, v in spec.items() if k != "$ref"},
        }
    return spec


def _string_reason(name: str, value: str, alt: dict) -> str | None:
    if "pattern" in alt and not re.search(alt["pattern"], value):
        return f"bad_value:{name}"
    if len(value) < alt.get("minLength", 0):
        return f"bad_value:{name}"
    if len(value) > alt.get("maxLength", 1 << 62):
        return f"text_too_long:{name}"
    return None


def _field_reason(name: str, value, spec: dict) -> str | None:
    """The first failing check of one present field: its JSON type, then its value."""
    spec = _resolve(spec)
    if "anyOf" in spec:  # a string in plaintext (its own rule) or sealed
        if not isinstance(value, str):
            return f"mistyped_field:{name}"
        alts = [_resolve(a) for a in spec["anyOf"]]
        reasons = [_string_reason(name, value, a) for a in alts]
        return None if any(r is None for r in reasons) else reasons[0]
    if spec.get("type") == "integer":
        if isinstance(value, bool) or not isinstance(value, int) or not -(2**63) <= value <= INT64_MAX:
            return f"mistyped_field:{name}"
        if value < spec.get("minimum", -(2**63)) or value > spec.get("maximum", INT64_MAX):
            return f"bad_value:{name}"
        return None
    if spec.get("type") == "string":
        if not isinstance(value, str):
            return f"mistyped_field:{name}"
        return _string_reason(name, value, spec)
    return None


def contract_reason(value: bytes | None) -> tuple[dict | None, str | None]:
    """(event, None) for a contract-valid record value, else (None, the quarantine reason)."""
    if value is None:
        return None, "bad_json"
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not_utf8"
    try:
        obj = json.loads(text)
    except ValueError:
        return None, "bad_json"
    if not isinstance(obj, dict):
        return None, "not_an_object"
    t = obj.get("type")
    if t is None:
        return None, "missing_field:type"
    if not isinstance(t, str):
        return None, "mistyped_field:type"
    if t not in CONTRACT.types:
        return None, "unknown_type"
    props = {**CONTRACT.envelope_props, **CONTRACT.type_props[t]}
    for name in sorted(obj):
        if name not in props:
            return None, f"unknown_field:{name}"
    for name in CONTRACT.envelope_required + CONTRACT.type_required[t]:
        if obj.get(name) is None:
            return None, f"missing_field:{name}"
    v = obj["schema_version"]
    if isinstance(v, bool) or v != 1 or not isinstance(v, int):
        return None, "bad_schema_version"
    for name, spec in props.items():
        if name in ("type", "schema_version") or obj.get(name) is None:
            continue
        reason = _field_reason(name, obj[name], spec)
        if reason:
            return None, reason
    dt, st, rt = obj["device_time"], obj["sent_time"], obj["received_time"]
    if abs(rt - st) > CONTRACT.max_skew:
        return None, "clock_skew:sent_time"
    if dt > st or st - dt > CONTRACT.max_offline or dt + (rt - st) < 0:
        return None, "clock_skew:device_time"
    if t in ("followed", "unfollowed") and obj["followee_id"] == obj["user_id"]:
        return None, "self_follow"
    return obj, None


# ------------------------------------------------------------------------------------------------
# The outcome
# ------------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    n: int
    dispositions: dict[tuple[int, int], tuple[str, str | None]] = field(default_factory=dict)
    users: dict[int, dict] = field(default_factory=dict)  # u -> {handle, display_name}
    status: dict[int, dict] = field(default_factory=dict)  # u -> {text, event_time}
    follows: dict[int, set[int]] = field(default_factory=dict)  # u -> followees (non-empty only)
    posts: dict[tuple[int, int], dict] = field(default_factory=dict)  # (author, post) -> row
    inbox: dict[int, dict[int, dict]] = field(default_factory=dict)  # r -> message id -> body
    erased: set[int] = field(default_factory=set)

    def accounting(self, partitions=None) -> dict[str, int]:
        out = {"applied": 0, "duplicates": 0, "rejected": 0, "quarantined": 0}
        name = {APPLIED: "applied", DUPLICATE: "duplicates", REJECTED: "rejected", QUARANTINED: "quarantined"}
        for (p, _o), (d, _r) in self.dispositions.items():
            if partitions is None or p in partitions:
                out[name[d]] += 1
        return out

    def followers(self, author: int) -> int:
        return sum(1 for fs in self.follows.values() if author in fs)

    def timeline(self, u: int, limit: int | None = None) -> list[dict]:
        """home timeline(u) as read: bodies {post_id, author_id, text, event_time}, newest first."""
        sources = {u} | self.follows.get(u, set())
        live = [
            {"post_id": pid, "author_id": a, "text": row["text"], "event_time": row["event_time"]}
            for (a, pid), row in self.posts.items()
            if a in sources and not row["deleted"]
        ]
        live.sort(key=lambda b: (b["event_time"], b["post_id"], b["author_id"]), reverse=True)
        return live[: self.n if limit is None else limit]

    def unread(self, u: int) -> int:
        return sum(1 for m in self.inbox.get(u, {}).values() if not m["read"])


# ------------------------------------------------------------------------------------------------
# The evaluation
# ------------------------------------------------------------------------------------------------
def key_user(e: dict) -> int:
    return e[CONTRACT.partition_key[e["type"]]]


def event_time(e: dict) -> int:
    return e["device_time"] + (e["received_time"] - e["sent_time"])


SEQUENCED = re.compile(r"sq:(0|[1-9][0-9]{0,14}):([1-9][0-9]{0,14})")


@dataclass
class _Run:
    """A writer's run in one partition: its seqs, its highest, its newest received_time."""

    seqs: set[int]
    high: int
    newest: int


def evaluate(
    log: dict[int, list[bytes | None]], n: int, window_ms: int, grace_ms: int, reorder: int
) -> Outcome:
    out = Outcome(n=n)
    applied: list[tuple[int, int, dict]] = []  # (partition, offset, event)
    # decisions that depend on log order: each partition alone
    for p, values in sorted(log.items()):
        seen: dict[str, int] = {}  # event_id -> newest received_time of its copies
        runs: dict[str, _Run] = {}  # writer -> its run here
        newest: int | None = None  # the partition's newest received_time
        erased_here: set[int] = set()
        posts_here: dict[tuple[int, int], bool] = {}  # (author, post) -> deleted
        inbox_here: set[tuple[int, int]] = set()  # (recipient, message)
        for o, value in enumerate(values):
            e, reason = contract_reason(value)
            if reason is not None:
                out.dispositions[p, o] = (QUARANTINED, reason)
                continue
            eid, rt = e["event_id"], e["received_time"]
            bound = None if newest is None else newest - window_ms - grace_ms
            sequenced = SEQUENCED.fullmatch(eid)
            if sequenced:
                writer, seq = sequenced.group(1), int(sequenced.group(2))
                run = runs.get(writer)
                if run is not None and bound is not None and run.newest < bound:
                    run = None  # forgotten
                if run is None:
                    runs[writer] = _Run({seq}, seq, rt)
                    duplicate = False
                else:
                    duplicate = seq in run.seqs or seq <= run.high - reorder
                    run.seqs.add(seq)
                    run.high, run.newest = max(run.high, seq), max(run.newest, rt)
            else:
                last = seen.get(eid)
                if last is not None and bound is not None and last < bound:
                    last = None  # forgotten
                seen[eid] = rt if last is None else max(last, rt)
                duplicate = last is not None and last >= rt - window_ms
            newest = rt if newest is None else max(newest, rt)
            if duplicate:
                out.dispositions[p, o] = (DUPLICATE, None)
                continue
            t = e["type"]
            reason = None
            if key_user(e) in erased_here:
                reason = "user_erased"
            elif t == "post_created":
                if (e["user_id"], e["post_id"]) in posts_here:
                    reason = "reused_id"
                else:
                    posts_here[e["user_id"], e["post_id"]] = False
            elif t == "post_deleted":
                k = (e["user_id"], e["post_id"])
                if k not in posts_here:
                    reason = "not_own_post"
                elif posts_here[k]:
                    reason = "post_already_deleted"
                else:
                    posts_here[k] = True
            elif t == "message_sent":
                k = (e["recipient_id"], e["message_id"])
                if k in inbox_here:
                    reason = "reused_id"
                else:
                    inbox_here.add(k)
            elif t == "message_read":
                if (e["user_id"], e["message_id"]) not in inbox_here:
                    reason = "not_in_inbox"
            elif t == "user_erased":
                erased_here.add(e["user_id"])
            if reason is not None:
                out.dispositions[p, o] = (REJECTED, reason)
            else:
                out.dispositions[p, o] = (APPLIED, None)
                applied.append((p, o, e))

    # the views: set functions of the applied events (log order only within a partition)
    erased = {e["user_id"] for _p, _o, e in applied if e["type"] == "user_erased"}
    out.erased = erased
    last_follow: dict[tuple[int, int], str] = {}
    reads: set[tuple[int, int]] = set()
    for _p, _o, e in applied:  # partition by partition, each in offset order
        t, u = e["type"], e["user_id"]
        if t == "user_registered" and u not in erased:
            out.users[u] = {"handle": e["handle"], "display_name": e["display_name"]}
        elif t == "status_updated" and u not in erased:
            out.status[u] = {"text": e["text"], "event_time": event_time(e)}
        elif t in ("followed", "unfollowed"):
            last_follow[u, e["followee_id"]] = t
        elif t == "post_created" and u not in erased:
            out.posts[u, e["post_id"]] = {"text": e["text"], "event_time": event_time(e), "deleted": False}
        elif t == "message_read":
            reads.add((u, e["message_id"]))
    for _p, _o, e in applied:
        if e["type"] == "post_deleted" and (e["user_id"], e["post_id"]) in out.posts:
            out.posts[e["user_id"], e["post_id"]]["deleted"] = True
        if e["type"] == "message_sent" and e["recipient_id"] not in erased:
            r, m, s = e["recipient_id"], e["message_id"], e["user_id"]
            out.inbox.setdefault(r, {})[m] = {
                "message_id": m,
                "sender_id": 0 if s in erased else s,
                "text": None if s in erased else e["text"],
                "event_time": event_time(e),
                "read": (r, m) in reads,
            }
    for (u, f), t in last_follow.items():
        if t == "followed" and u not in erased and f not in erased:
            out.follows.setdefault(u, set()).add(f)
    return out
