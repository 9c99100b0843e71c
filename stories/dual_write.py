"""``make dual-write``: the inconsistency the log design removes, reproduced and measured.

The same Locust workload (``app_sim/locustfile_retry.py``: ``locustfile.py``'s users, retrying
timed-out writes with their ``Idempotency-Key``, and setting their status) runs against the API
twice, with the same seeded faults (``app_sim/api/dual_write.py``: a worker crash between two
writes, counter read-modify-writes racing across the 2 API workers, a stalled request the
client retries, a store write failing after the log append):

- ``log`` mode (the design): the API only appends to the log;
- ``dual`` mode (the anti-pattern): the API also writes namespace ``dual`` itself, and serves its
  reads from it.

Both runs append to one topic, ``dw.events``, one after the other (each mode's events are its
*span* of the log: the end offsets before and after its run; the two runs' users never meet).
Once both runs are over, the real speed layer (``python -m pipelines.speed_layer --topic
dw.events --namespace replay``, its keyed serving path) folds the whole log into namespace ``replay``, in one
micro-batch: on a busy 2-core machine its micro-batches cost minutes each, so a live one would
only add batches, and the views are a function of the log, not of when they are computed. The
cost: during the log-mode run the API's reads find its namespace empty (its clients read no
messages to mark them read), while dual mode's reads see its own writes.

Then, per mode, the derived state in Redis is compared with **the log's truth**: an independent
fold of the mode's span in Python (:func:`fold`, the view semantics of docs/views.md: dedup by ``event_id``,
follows, live posts (a post is its author and its id), home timelines of the latest N, inbox with
read flags, last status in log order; not the speed layer's code, so the log design's zero is a
check, not a tautology), for the span's users only. The store is read as users read it: a home
timeline through the API's read (:class:`contract.serving.ServingReader`, ``FCALL_RO
social_timeline``: the stored part merged with the posts of followed authors above the fan-out
threshold), never the raw ``tl:`` keys, so where the threshold sits cannot make a correct store
look wrong. The log design's state is ``replay``; dual mode's is ``dual``. Counted
(:func:`divergences`): users whose unread counter differs from the unread messages in their
inbox; inbox and timeline entries missing or extra; statuses that are not the last one. Each
divergence is attributed to the journaled faults that touched it (:func:`attribute`), named by
the failure it is (lost update, partial write, out-of-order write); none touched it:
``unattributed`` (a race of the dual writes themselves, with no fault injected).

Repair: the namespace rebuilt from the log by a replay (the speed layer from offset 0 into a
fresh namespace, blue/green as ``rebuild`` does): that is ``replay``, counted again per mode. For
the log design, repair changes nothing: its store already is that replay.

The fault-rate sweep: more runs on the same log, each with fresh users, at multiples of the
rates (``--sweep``, default 0 and 3; 1 is the two runs above; ``crash`` no higher than 1x, see
:func:`scaled`): dual mode at each, the log design at each nonzero one. Per fault, the divergences it touched in dual mode against its rate, and
every divergence of the log design at the same rates (:func:`sweep_by_fault`).

Everything runs on a private stack (Kafka, Redis on free ports, state under
``var/dual_write/``), so a ``make up`` stack is never touched. Report:
``var/reports/dual_write/latest.json``, ``latest.html`` (with the plots), ``divergences.png``,
``sweep.json``, ``sweep.png``.

``python -m stories.dual_write [--users 30] [--run-time 15] [--seed 7] [--crash 5] [--race 150]
[--timeout 15] [--store-fail 20] [--sweep 0,3]`` (rates per mille; ``SOCIAL_FAULT_*`` variables,
when set, replace these defaults).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from app_sim.api.dual_write import FAILURE, FAULTS, corrected_time, journal_key
from infra import clients
from infra.cli import command_name, run_main
from infra.html import render as render_page
from infra.settings import Settings, get_settings, redact_url
from pipelines.report import png_bytes
from pipelines.speed_layer_process import SpeedLayerProcess

MODES = ("log", "dual")
TOPIC = "dw.events"  # both runs append here, one after the other; each mode's truth is its span
REPLAY = "replay"  # the speed layer's namespace: the log design's store, and the repaired one
METRICS = (
    "counter_mismatch_users",
    "inbox_missing",
    "inbox_extra",
    "timeline_missing",
    "timeline_extra",
    "status_not_last",
)
METRIC_TEXT = {
    "counter_mismatch_users": "users whose unread counter != unread messages in their inbox",
    "inbox_missing": "inbox entries missing (in the log, not in the store)",
    "inbox_extra": "inbox entries extra (in the store, not in the log)",
    "timeline_missing": "timeline entries missing",
    "timeline_extra": "timeline entries extra",
    "status_not_last": "statuses that are not the user's last one in the log",
}
DEFAULT_FAULTS = {"crash": 5, "race": 150, "timeout": 15, "store_fail": 20}  # per mille
ENV = {f: f"SOCIAL_FAULT_{f.upper()}_PERMILLE" for f in FAULTS}


# --- the log's truth: an independent fold of docs/views.md ------------------------------------------


@dataclass
class Truth:
    users: set[int] = field(default_factory=set)
    inbox: dict[int, dict[int, bool]] = field(default_factory=dict)  # user -> message id -> read
    timeline: dict[int, set[tuple[int, int]]] = field(default_factory=dict)  # user -> (author, post)
    status: dict[int, str] = field(default_factory=dict)  # user -> text of the last status
    events: int = 0
    duplicates: int = 0
    no_effect: int = 0  # would be quarantined: a read of a message not in the inbox, a foreign delete


def fold(events: Iterable[dict], timeline_length: int = 800) -> Truth:
    """The views of docs/views.md from events in log order (order matters within a partition only).

    Only what the API can append is handled (it validates every event against the contract);
    the dedup window is the whole log (a run lasts minutes, the window a day).
    """
    t = Truth()
    seen: set[str] = set()
    follows: dict[int, set[int]] = defaultdict(set)
    posts: dict[tuple[int, int], int] = {}  # (author, post id) -> corrected time, live only
    inbox: dict[int, dict[int, bool]] = defaultdict(dict)
    for e in events:
        t.events += 1
        if e["event_id"] in seen:
            t.duplicates += 1
            continue
        seen.add(e["event_id"])
        kind, u = e["type"], e["user_id"]
        if kind == "user_registered":
            t.users.add(u)
        elif kind == "status_updated":
            t.status[u] = e["text"]
        elif kind == "followed":
            follows[u].add(e["followee_id"])
        elif kind == "unfollowed":
            follows[u].discard(e["followee_id"])
        elif kind == "post_created":
            posts[(u, e["post_id"])] = corrected_time(e)
        elif kind == "post_deleted":
            if (u, e["post_id"]) in posts:  # only the author deletes, their own post
                del posts[(u, e["post_id"])]
            else:
                t.no_effect += 1
        elif kind == "message_sent":
            inbox[e["recipient_id"]].setdefault(e["message_id"], False)
        elif kind == "message_read":
            if e["message_id"] in inbox.get(u, {}):
                inbox[u][e["message_id"]] = True
            else:
                t.no_effect += 1
    by_author: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for (author, pid), when in posts.items():
        by_author[author].append((when, pid, author))
    for u in t.users | set(follows) | set(by_author):
        candidates = [p for a in {u, *follows[u]} for p in by_author.get(a, ())]
        # newest first; ties: post id, then author, descending (docs/views.md, "Identity")
        newest = sorted(candidates, reverse=True)[:timeline_length]
        t.timeline[u] = {(author, pid) for _, pid, author in newest}
    t.inbox = {u: dict(m) for u, m in inbox.items()}
    return t


def read_log(
    settings: Settings, topic: str, start: dict[int, int] | None = None, end: dict[int, int] | None = None
) -> list[dict]:
    """The records of ``topic`` from ``start`` (default: 0) to ``end`` (default: its current end),
    partition by partition, in offset order."""
    from confluent_kafka import TopicPartition

    from infra.stack import end_offsets

    ends = end or end_offsets(settings, topic)
    start = start or {}
    consumer = clients.kafka_consumer(settings, "dual-write-truth")
    out: list[dict] = []
    try:
        for p, stop in ends.items():
            first = start.get(p, 0)
            if stop <= first:
                continue
            consumer.assign([TopicPartition(topic, p, first)])
            got = []
            deadline = time.monotonic() + 60
            while not got or got[-1][0] < stop - 1:
                msg = consumer.poll(1.0)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"reading {topic}[{p}] timed out at {len(got)}/{stop - first}")
                if msg is None or msg.error() is not None:
                    continue
                got.append((msg.offset(), json.loads(msg.value())))
            out += [e for _, e in got]
    finally:
        consumer.close()
    return out


# --- what a namespace of the serving store holds --------------------------------------------------------


@dataclass
class StoreState:
    unread: dict[int, int]
    inbox: dict[int, dict[int, bool]]
    timeline: dict[int, set[tuple[int, int]]]  # user -> (author, post), as the API reads it
    status: dict[int, str]


def _reader_url(r) -> str:
    kw = r.connection_pool.connection_kwargs  # the same server as ``r``, read by asyncio
    auth = f":{kw['password']}@" if kw.get("password") else ""
    return f"redis://{auth}{kw.get('host', '127.0.0.1')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"


def read_timelines(
    r,
    namespace: str,
    users: Iterable[int],
    timeline_length: int = 800,
    layout: str = "keyed",
    partitions: int = 0,
) -> dict:
    """Each user's home timeline as users read it: the API's read (``contract.serving.reader``:
    the stored entries merged with the posts of followed authors above the fan-out threshold), its
    first N, as (author, post) pairs."""
    return _read_users(r, namespace, users, layout, partitions, timeline_length)["timeline"]


def _read_users(
    r,
    namespace: str,
    users: Iterable[int],
    layout: str,
    partitions: int,
    timeline_length: int,
    *,
    all_views=False,
) -> dict[str, dict]:
    """The users' views through the API's reader of ``layout``: timelines (and, ``all_views``,
    inboxes with their read flags, unread counters and statuses)."""
    import asyncio

    from contract.serving import reader

    async def read_all() -> dict[str, dict]:
        client = clients.redis_client(_reader_url(r), decode_responses=True, asyncio=True)
        store = reader(client, namespace, layout, partitions)
        out: dict[str, dict] = {"timeline": {}, "inbox": {}, "unread": {}, "status": {}}
        try:
            for u in users:
                bodies, _as_of = await store.timeline(u, timeline_length)
                out["timeline"][u] = {(int(b["author_id"]), int(b["post_id"])) for b in bodies}
                if not all_views:
                    continue
                msgs, _ = await store.inbox(u, 1_000_000)
                if msgs:
                    out["inbox"][u] = {int(m["message_id"]): bool(m["read"]) for m in msgs}
                n, _ = await store.unread(u)
                if n:
                    out["unread"][u] = n
                status, _ = await store.status(u)
                if status is not None:
                    out["status"][u] = status["text"]
            return out
        finally:
            await client.aclose()

    return asyncio.run(read_all())


def read_store(
    r,
    namespace: str,
    users: Iterable[int],
    timeline_length: int = 800,
    layout: str = "keyed",
    partitions: int = 0,
) -> StoreState:
    """The parts of a namespace the comparison needs, for ``users`` (key layout:
    ``contract/functions.py``); the timelines read as the API reads them
    (:func:`read_timelines`), never from the raw ``tl:`` keys. In the partitioned layout (the log
    design's store when ``SOCIAL_SERVING_LAYOUT=partitioned``; dual mode always writes the keyed
    one) every view of ``users`` through the API's reader."""

    def user_of(key: str) -> int:
        return int(key.rsplit(":", 1)[1])

    users = sorted(set(users))
    if layout == "partitioned":
        got = _read_users(r, namespace, users, layout, partitions, timeline_length, all_views=True)
        timeline = {u: tl for u, tl in got["timeline"].items() if tl}
        return StoreState(unread=got["unread"], inbox=got["inbox"], timeline=timeline, status=got["status"])
    inbox = {
        user_of(key): {int(mid): bool(json.loads(body)["read"]) for mid, body in r.hgetall(key).items()}
        for key in r.scan_iter(f"{namespace}:msgs:*", count=1000)
    }
    return StoreState(
        unread={int(u): int(n) for u, n in r.hgetall(f"{namespace}:unread").items()},
        inbox=inbox,
        timeline={u: tl for u, tl in read_timelines(r, namespace, users, timeline_length).items() if tl},
        status={int(u): json.loads(v)["text"] for u, v in r.hgetall(f"{namespace}:status").items()},
    )


def divergences(store: StoreState, truth: Truth, only: set[int] | None = None) -> dict[str, list]:
    """Every divergence, by metric: a user id, or a (user id, entry id) pair.

    ``only``: compare these users' state alone (a namespace that also holds other users').
    """
    if only is not None:
        store = StoreState(*({u: v for u, v in d.items() if u in only} for d in vars(store).values()))
        truth = replace(
            truth,
            users=truth.users & only,
            **{
                n: {u: v for u, v in getattr(truth, n).items() if u in only}
                for n in ("inbox", "timeline", "status")
            },
        )
    users = truth.users | set(store.unread) | set(store.inbox)
    out: dict[str, list] = {m: [] for m in METRICS}
    for u in sorted(users):
        unread_in_inbox = sum(1 for read in store.inbox.get(u, {}).values() if not read)
        if store.unread.get(u, 0) != unread_in_inbox:
            out["counter_mismatch_users"].append(u)
    for name, got, want in (
        ("inbox", store.inbox, truth.inbox),
        ("timeline", store.timeline, truth.timeline),
    ):
        for u in sorted(set(got) | set(want)):
            have, should = set(got.get(u, ())), set(want.get(u, ()))
            out[f"{name}_missing"] += [(u, x) for x in sorted(should - have)]
            out[f"{name}_extra"] += [(u, x) for x in sorted(have - should)]
    for u in sorted(set(store.status) | set(truth.status)):
        if store.status.get(u) != truth.status.get(u):
            out["status_not_last"].append(u)
    return out


def read_journal(
    r, topic: str, mode: str | None = None, window_ms: tuple[int, int] | None = None
) -> list[dict]:
    """The faults journaled for ``topic``: of this mode, journaled within this wall-clock window
    (one run's: the runs are one after the other, each starting and stopping its own API)."""
    entries = [json.loads(x) for x in r.lrange(journal_key(topic), 0, -1)]
    return [
        j
        for j in entries
        if (mode is None or j["mode"] == mode)
        and (window_ms is None or window_ms[0] <= j["at"] <= window_ms[1])
    ]


def attribute(found: dict[str, list], journal: list[dict]) -> dict[str, dict[str, int]]:
    """Per fault (and ``unattributed``): how many divergences of each metric it touched.

    A fault touches an inbox (messages sent to, or read by, its owner), the timelines a post of
    it reaches (by author and post id) or a follower's timeline (its follow), a user's status. A
    divergence touched by two faults counts for both.
    """
    inbox_of, post_of, follow_of, status_of = (defaultdict(set) for _ in range(4))
    for j in journal:
        kind, fault = j.get("type"), j["fault"]
        if kind == "message_sent":
            inbox_of[j["recipient_id"]].add(fault)
        elif kind == "message_read":
            inbox_of[j["user_id"]].add(fault)
        elif kind in ("post_created", "post_deleted"):
            post_of[(j["user_id"], j["post_id"])].add(fault)
        elif kind in ("followed", "unfollowed"):
            follow_of[j["user_id"]].add(fault)
        elif kind == "status_updated":
            status_of[j["user_id"]].add(fault)
    out = {f: dict.fromkeys(METRICS, 0) for f in (*FAULTS, "unattributed")}
    for metric, items in found.items():
        for item in items:
            if metric.startswith(("counter", "inbox")):
                u = item if isinstance(item, int) else item[0]
                faults = inbox_of[u]
            elif metric.startswith("timeline"):
                u, post = item  # post: (author, post id)
                faults = post_of[tuple(post)] | follow_of[u]
            else:
                faults = status_of[item]
            for f in faults or {"unattributed"}:
                out[f][metric] += 1
    return out


def summarize(found: dict[str, list], journal: list[dict], examples: int = 5) -> dict:
    return {
        "counts": {m: len(v) for m, v in found.items()},
        "total": sum(len(v) for v in found.values()),
        "by_fault": attribute(found, journal),
        "examples": {
            m: [json.loads(json.dumps(x)) if isinstance(x, tuple) else x for x in v[:examples]]
            for m, v in found.items()
        },
    }


# --- the run ----------------------------------------------------------------------------------------------


def private_settings(var_dir: Path, **overrides) -> Settings:
    """This experiment's own stack: free ports, state under var_dir (never a `make up` stack's)."""
    from infra.stack import free_port_block

    port = free_port_block(4)  # Kafka, its controller, Redis, the API: below the ephemeral range
    return get_settings(
        kafka_port=port,
        kafka_controller_port=port + 1,
        redis_port=port + 2,
        kafka_bootstrap=f"127.0.0.1:{port}",
        redis_url=f"redis://127.0.0.1:{port + 2}/0",
        api_port=port + 3,
        api_workers=2,
        var_dir=var_dir,
        **overrides,
    )


_T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"==> [{time.monotonic() - _T0:5.0f} s] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class RunSpec:
    """One Locust run against the API in one mode: its own users, its own span of the log."""

    label: str  # the Locust users' key space (LOAD_RUN), the report's name for it
    mode: str
    rates: dict[str, int]
    run_time_s: int
    scale: float | None = None  # a sweep point: the default rates times this


SWEEP_CAPPED = {"crash": 1.0}  # a fault swept no higher than this multiple (see scaled)


def scaled(rates: dict[str, int], scale: float) -> dict[str, int]:
    """The rates times ``scale``, but ``crash`` no higher than its own rate: each crash restarts
    an API worker, seconds on a busy 2-core machine, and at 3x the restarts starve the workload
    (a fifth of the writes), which would hide every other fault's proportion."""
    return {f: min(1000, round(rate * min(scale, SWEEP_CAPPED.get(f, scale)))) for f, rate in rates.items()}


def mode_settings(base: Settings, mode: str, rates: dict[str, int], seed: int) -> Settings:
    return replace(
        base,
        events_topic=TOPIC,
        write_mode=mode,
        views_namespace=REPLAY if mode == "log" else "dual",  # the speed layer's, or its own
        dual_namespace="dual",
        fault_seed=seed,
        **{f"fault_{f}_permille": rates[f] for f in FAULTS},
    )


def run_workload(
    settings: Settings, out_dir: Path, users: int, run_time_s: int, seed: int, label: str
) -> dict:
    """The API in this mode (2 workers) under the retrying Locust workload; returns Locust's summary."""
    from app_sim.load import run_locust
    from infra.stack import ApiServer

    api = ApiServer(settings)
    api.start()
    try:
        return run_locust(
            f"http://127.0.0.1:{settings.api_port}",
            out_dir,
            users=users,
            spawn_rate=max(users / 3, 1),
            run_time_s=run_time_s,
            locustfile=Path(__file__).resolve().parent.parent / "app_sim" / "locustfile_retry.py",
            user_classes=("RetryingSocialUser",),
            extra_env={"LOAD_SEED": str(seed), "LOAD_RUN": label, "LOAD_FOLLOWS": "8"},
        )
    finally:
        api.stop()


def measure(
    r,
    truth: Truth,
    namespace: str,
    journal: list[dict],
    timeline_length: int = 800,
    layout: str = "keyed",
    partitions: int = 0,
) -> dict:
    """A namespace against the truth of one mode's span of the log, for that span's users only."""
    store = read_store(r, namespace, truth.users, timeline_length, layout, partitions)
    return summarize(divergences(store, truth, only=truth.users), journal)


def run(
    base: Settings,
    users: int,
    run_time_s: int,
    seed: int,
    rates: dict[str, int],
    report_dir: Path,
    sweep: tuple[float, ...] = (),
) -> dict:
    """The main runs (both modes at ``rates``: the sweep's point 1), then the sweep's other points,
    as long each: dual mode at each multiple of ``rates``, the log design at each nonzero one (at
    0 nothing is injected into it)."""
    from contract.serving import connect
    from infra.stack import BACKBONE, Stack

    sweep = tuple(x for x in sweep if x != 1)  # 1: the main runs
    specs = run_specs(rates, run_time_s, sweep)
    started = time.monotonic()
    stack = Stack(base, service_types=BACKBONE)
    say(
        f"private stack: Kafka {base.kafka_bootstrap}, Redis {redact_url(base.redis_url)}, state under {base.var_dir}"
    )
    stack.up()
    live: list[SpeedLayerProcess] = []
    try:
        r = connect(base.redis_url)
        _create_topic(base)
        report: dict = {"modes": {}, "phases_s": {}}
        mark = started  # the "stack" phase includes its start

        def phase(name: str) -> None:
            nonlocal mark
            report["phases_s"][name] = round(time.monotonic() - mark, 1)
            mark = time.monotonic()

        phase("stack")
        runs = _run_all(base, specs, users, seed, report_dir, phase)
        if sweep:
            phase("sweep_runs")
        _fold_log(mode_settings(base, "log", rates, seed), live)
        phase("speed_layer")
        points = _measure_all(base, r, specs, runs, report)
        if sweep:
            report["sweep"] = {
                "scales": sorted({1.0, *sweep}),
                "run_time_s": run_time_s,
                "base_permille": rates,
                "points": points,
            }
        phase("measure")
    finally:
        for sl in live:
            sl.stop()
        stack.down()
    report.update(
        seconds=round(time.monotonic() - started, 1),
        generated_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        seed=seed,
        fault_permille=rates,
        fault_failure=FAILURE,
        race_ms=base.fault_race_ms,
        stall_ms=base.fault_stall_ms,
        locust_users=users,
        locust_run_time_s=run_time_s,
        fanout_threshold=base.fanout_threshold,
        metrics=METRIC_TEXT,
        truth=(
            "an independent Python fold of each mode's span of the log (stories/dual_write.py: fold), "
            "not the speed layer's code"
        ),
    )
    return report


def _fold_log(settings: Settings, live: list[SpeedLayerProcess]) -> None:
    """The real speed layer folds the whole log into namespace ``replay`` (in one micro-batch: the
    runs are over), then stops; while it runs it is in ``live``, for the caller's cleanup."""
    say(f"the speed layer: {TOPIC} -> namespace {REPLAY!r}, in one micro-batch")
    speed_layer = SpeedLayerProcess(
        settings, TOPIC, REPLAY, settings.log_dir / f"speed_layer-{REPLAY}.log", archive=False
    ).start()
    live.append(speed_layer)
    speed_layer.wait_caught_up(timeout=240)
    speed_layer.stop()


def run_specs(rates: dict[str, int], run_time_s: int, sweep: tuple[float, ...]) -> list[RunSpec]:
    """The runs, in order: both modes at ``rates`` (the sweep's point 1, when there is a sweep),
    then at each other multiple in ``sweep``, dual mode always, the log design when nonzero."""
    return [RunSpec(m, m, rates, run_time_s, 1.0 if sweep else None) for m in MODES] + [
        RunSpec(f"{m}@{x:g}", m, scaled(rates, x), run_time_s, x)
        for x in sweep
        for m in MODES
        if m == "dual" or x > 0
    ]


def _create_topic(base: Settings) -> None:
    """The experiment's topic, once its metadata has reached the broker's cache."""
    from confluent_kafka import KafkaException

    from infra.stack import StackError, create_topic, end_offsets

    create_topic(base, TOPIC, base.events_partitions)
    for _ in range(40):  # until the new topic's metadata has reached the broker's cache
        try:
            end_offsets(base, TOPIC)
            break
        except (StackError, KafkaException):
            time.sleep(0.25)


def _run_all(base: Settings, specs: list[RunSpec], users: int, seed: int, report_dir: Path, phase) -> dict:
    """Every run, one after the other: per label, its span of the log (end offsets before and
    after), its wall-clock window (for the journal) and Locust's summary."""
    from contract.ids import wall_clock_ms
    from infra.stack import end_offsets

    runs: dict[str, dict] = {}
    for spec in specs:
        say(
            f"{spec.label}: {spec.mode} mode, {users} Locust users for {spec.run_time_s} s, "
            f"faults {spec.rates} per mille, seed {seed}"
        )
        first, since = end_offsets(base, TOPIC), wall_clock_ms()
        summary = run_workload(
            mode_settings(base, spec.mode, spec.rates, seed),
            report_dir / f"locust_{spec.label}",
            users,
            spec.run_time_s,
            seed,
            spec.label,
        )
        span = (first, end_offsets(base, TOPIC))
        runs[spec.label] = {"span": span, "window": (since, wall_clock_ms()), "locust": summary}
        if spec.label in MODES:
            phase(f"{spec.mode}_run")
    return runs


def _measure_all(base: Settings, r, specs: list[RunSpec], runs: dict, report: dict) -> list[dict]:
    """Each run's span of the log against its store: the main runs' figures (before and after
    repair) into ``report["modes"]``; the sweep's points returned."""
    from infra.stack import end_offsets

    points = []
    parts = len(end_offsets(base, TOPIC))
    for spec in specs:
        span, window, locust = (
            runs[spec.label]["span"],
            runs[spec.label]["window"],
            runs[spec.label]["locust"],
        )
        truth = fold(read_log(base, TOPIC, *span), base.timeline_length)
        journal = read_journal(r, TOPIC, spec.mode, window)
        namespace = REPLAY if spec.mode == "log" else "dual"
        # the speed layer's store in its layout; the dual-mode API writes the keyed one
        layout = base.serving_layout if spec.mode == "log" else "keyed"
        before = measure(r, truth, namespace, journal, base.timeline_length, layout, parts)
        injected = {f: sum(1 for j in journal if j["fault"] == f) for f in FAULTS}
        if spec.scale is not None:
            points.append(
                {
                    "scale": spec.scale,
                    "mode": spec.mode,
                    "permille": spec.rates,
                    "writes": locust["writes"]["requests"],
                    "events": truth.events,
                    "faults_injected": injected,
                    "total": before["total"],
                    "counts": before["counts"],
                    "by_fault": {f: sum(v.values()) for f, v in before["by_fault"].items()},
                }
            )
        if spec.label not in MODES:
            continue
        report["modes"][spec.mode] = {
            "locust": locust,
            "log_span": {"from": span[0], "to": span[1]},
            "namespace": namespace,
            "events": truth.events,
            "duplicates": truth.duplicates,
            "no_effect": truth.no_effect,
            "users": len(truth.users),
            "faults_injected": injected,
            "faults_by_event_type": {
                f: dict(Counter(j.get("type") for j in journal if j["fault"] == f)) for f in FAULTS
            },
            "before_repair": before,
            # the repair: the namespace rebuilt from the log, i.e. the replay's; for the log
            # design that is its own namespace already
            "after_repair": {
                **measure(r, truth, REPLAY, journal, base.timeline_length, base.serving_layout, parts),
                "namespace": REPLAY,
            },
        }
    return points


# --- the report ------------------------------------------------------------------------------------------


def plot(report: dict) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = [
        (f"{mode} {when.replace('_', ' ')}", report["modes"][mode][when]["counts"])
        for mode in MODES
        for when in ("before_repair", "after_repair")
    ]
    colors = ["#4c78a8", "#9ecae9", "#e45756", "#ff9d98"]
    fig, ax = plt.subplots(figsize=(10, 4), dpi=100)
    try:
        width = 0.8 / len(series)
        for i, ((label, counts), color) in enumerate(zip(series, colors, strict=True)):
            xs = [j + i * width for j in range(len(METRICS))]
            ax.bar(xs, [counts[m] for m in METRICS], width=width, label=label, color=color)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(METRICS))])
        ax.set_xticklabels([m.replace("_", "\n") for m in METRICS], fontsize=8)
        ax.set_ylabel("divergences from the log")
        ax.set_title("the same workload and faults: dual writes vs. the log design")
        ax.legend()
        return png_bytes(fig)
    finally:
        plt.close(fig)


def sweep_by_fault(report: dict) -> dict[str, list[dict]]:
    """Per fault, per sweep point: its rate, and the divergences it touched in dual mode next to
    every divergence of the log design at the same rates."""
    points = report["sweep"]["points"]
    log_at = {p["scale"]: p for p in points if p["mode"] == "log"}
    return {
        f: [
            {
                "scale": p["scale"],
                "permille": p["permille"][f],
                "injected": p["faults_injected"][f],
                "dual_writes": p["writes"],
                "dual": p["by_fault"][f],
                "dual_per_1000_writes": round(1000 * p["by_fault"][f] / max(p["writes"], 1), 2),
                "log_total": log_at[p["scale"]]["total"] if p["scale"] in log_at else None,
                "log_writes": log_at[p["scale"]]["writes"] if p["scale"] in log_at else None,
            }
            for p in sorted(points, key=lambda p: p["scale"])
            if p["mode"] == "dual"
        ]
        for f in FAULTS
    }


def plot_sweep(report: dict) -> bytes:
    """One panel per fault: divergences it touched (dual mode) and the log design's, vs. its rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = sweep_by_fault(report)
    fig, axes = plt.subplots(1, len(FAULTS), figsize=(12, 3.2), dpi=100)
    try:
        for ax, f in zip(axes, FAULTS, strict=True):
            xs = [c["permille"] for c in curves[f]]
            ax.plot(
                xs, [c["dual_per_1000_writes"] for c in curves[f]], "o-", color="#e45756", label="dual writes"
            )
            logged = [c for c in curves[f] if c["log_total"] is not None]
            ax.plot(
                [c["permille"] for c in logged],
                [1000 * c["log_total"] / max(c["log_writes"], 1) for c in logged],
                "s--",
                color="#4c78a8",
                label="the log (all)",
            )
            ax.set_title(f"{f}: {FAILURE[f]}", fontsize=9)
            ax.set_xlabel("fault rate (per mille of writes)", fontsize=8)
            ax.tick_params(labelsize=8)
            ax.set_ylim(bottom=0)
        axes[0].set_ylabel("divergences per 1,000 writes")
        axes[0].legend(fontsize=8)
        fig.suptitle(f"fault-rate sweep ({report['sweep']['run_time_s']} s of Locust per run)", fontsize=10)
        return png_bytes(fig)
    finally:
        plt.close(fig)


def _by_metric(counts: dict) -> str:
    return ", ".join(f"{k}: {v}" for k, v in counts.items() if v)


def _sweep(report: dict, png: bytes) -> dict | None:
    """The sweep's part of the page (None when the run had no sweep)."""
    if "sweep" not in report:
        return None
    curves = sweep_by_fault(report)
    return {
        "scales": ", ".join(f"{x:g}" for x in report["sweep"]["scales"]),
        "run_time_s": report["sweep"]["run_time_s"],
        "unattributed": ", ".join(
            f"{p['scale']:g}x: {p['by_fault']['unattributed']}"
            for p in report["sweep"]["points"]
            if p["mode"] == "dual"
        ),
        "png": base64.b64encode(png).decode(),
        "rows": [
            {**c, "fault": f, "failure": FAILURE[f], "scale": f"{c['scale']:g}"}
            for f in FAULTS
            for c in curves[f]
        ],
    }


def render(report: dict, png: bytes, sweep_png: bytes = b"") -> str:
    """The page (infra/templates/dual_write.html.j2)."""
    modes = report["modes"]
    dual = modes["dual"]
    unattributed = dual["before_repair"]["by_fault"]["unattributed"]
    return render_page(
        "dual_write.html.j2",
        locust_users=report["locust_users"],
        locust_run_time_s=report["locust_run_time_s"],
        seed=report["seed"],
        truth=report["truth"],
        fanout_threshold=report.get("fanout_threshold", "-"),
        seconds=report["seconds"],
        phases=", ".join(f"{k} {v} s" for k, v in report["phases_s"].items()),
        generated_at=report["generated_at"],
        metrics=[
            (
                METRIC_TEXT[m],
                [
                    modes[mode][when]["counts"][m]
                    for mode in MODES
                    for when in ("before_repair", "after_repair")
                ],
            )
            for m in METRICS
        ],
        png=base64.b64encode(png).decode(),
        faults=[
            {
                "fault": f,
                "failure": FAILURE[f],
                "permille": report["fault_permille"][f],
                "injected_log": modes["log"]["faults_injected"][f],
                "injected_dual": dual["faults_injected"][f],
                "touched": sum(dual["before_repair"]["by_fault"][f].values()),
                "by_metric": _by_metric(dual["before_repair"]["by_fault"][f]),
            }
            for f in FAULTS
        ],
        unattributed={"touched": sum(unattributed.values()), "by_metric": _by_metric(unattributed)},
        modes=[
            {
                "mode": mode,
                "span": json.dumps(d["log_span"]),
                "namespace": d["namespace"],
                "events": d["events"],
                "duplicates": d["duplicates"],
                "requests": d["locust"]["requests"],
                "failures": d["locust"]["failures"],
            }
            for mode, d in modes.items()
        ],
        sweep=_sweep(report, sweep_png),
    )


def write_report(report: dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    png = plot(report)
    (out_dir / "divergences.png").write_bytes(png)
    (out_dir / "latest.json").write_text(json.dumps(report, indent=2, default=list) + "\n")
    sweep_png = b""
    if "sweep" in report:
        sweep_png = plot_sweep(report)
        (out_dir / "sweep.png").write_bytes(sweep_png)
        sweep = {**report["sweep"], "by_fault": sweep_by_fault(report), "failure": FAILURE}
        (out_dir / "sweep.json").write_text(json.dumps(sweep, indent=2) + "\n")
    page = out_dir / "latest.html"
    page.write_text(render(report, png, sweep_png))
    return page


def print_table(report: dict) -> None:
    head = f"{'':52} {'log':>6} {'log*':>6} {'dual':>6} {'dual*':>6}"
    print(head + "    (* after repair)")
    for m in METRICS:
        vals = [
            report["modes"][mode][w]["counts"][m] for mode in MODES for w in ("before_repair", "after_repair")
        ]
        print(f"{METRIC_TEXT[m][:52]:52} " + " ".join(f"{v:>6}" for v in vals))
    if "sweep" in report:
        print(
            f"sweep ({report['sweep']['run_time_s']} s per point): per fault, rate -> divergences it "
            "touched in dual mode / every divergence of the log design"
        )
        for f, curve in sweep_by_fault(report).items():
            cells = "  ".join(f"{c['permille']}: {c['dual']}/{c['log_total']}" for c in curve)
            print(f"  {f:11} {cells}")


def main(argv: list[str] | None = None) -> int:
    settings = get_settings()
    p = argparse.ArgumentParser(prog=command_name("stories.dual_write"), description=__doc__.splitlines()[0])
    p.add_argument("--users", type=int, default=30, help="Locust users (30)")
    p.add_argument("--run-time", type=int, default=15, help="seconds of Locust per run (15)")
    p.add_argument("--seed", type=int, default=settings.fault_seed)
    p.add_argument(
        "--stall-ms",
        type=int,
        default=8000,
        help="how long a timed-out write stalls (8000: long enough for the client's next writes to pass it)",
    )
    for f in FAULTS:
        default = int(os.environ[ENV[f]]) if os.environ.get(ENV[f]) else DEFAULT_FAULTS[f]
        p.add_argument(f"--{f.replace('_', '-')}", type=int, default=default, help=f"per mille ({default})")
    p.add_argument(
        "--fanout-threshold",
        type=int,
        default=settings.fanout_threshold,
        help="the speed layer's fan-out threshold in the log design (SOCIAL_FANOUT_THRESHOLD, "
        f"{settings.fanout_threshold}); the stores are read as the API reads them, so any threshold "
        "shows the log design's store as it is",
    )
    p.add_argument(
        "--sweep",
        default="0,3",
        help="fault-rate sweep: multiples of the rates besides 1 (the main runs), each a run of "
        "dual mode and, if nonzero, of log mode ('0,3'; '' for none)",
    )
    a = p.parse_args(argv)
    try:
        sweep = tuple(float(x) for x in a.sweep.split(",") if x.strip())
    except ValueError:
        p.error(f"--sweep {a.sweep!r}: expected numbers separated by commas, e.g. 0,1,3")
    if any(x < 0 for x in sweep):
        p.error(f"--sweep {a.sweep!r}: multiples must be >= 0")
    rates = {f: getattr(a, f) for f in FAULTS}
    var_dir = Path(settings.var_dir) / "dual_write"
    shutil.rmtree(var_dir, ignore_errors=True)  # a fresh log and store every run
    base = private_settings(var_dir, fault_stall_ms=a.stall_ms, fanout_threshold=a.fanout_threshold)
    report = run(
        base,
        a.users,
        a.run_time,
        a.seed,
        rates,
        Path(settings.reports_dir) / "dual_write",
        sweep,
    )
    page = write_report(report, Path(settings.reports_dir) / "dual_write")
    print_table(report)
    print(f"-> {page} ({report['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "stories.dual_write"))
