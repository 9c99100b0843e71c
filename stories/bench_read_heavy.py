"""``make bench`` section ``read_heavy``: timeline reads beside a growing write rate (issue 53, item 3).

The fan-out threshold (``SOCIAL_FANOUT_THRESHOLD``, 1,000: every author of the default graph fanned
out on write) was chosen for a read-heavy app: one where timelines are read at least 20 times as
often as posts are written. This section measures that workload on one machine, the stack as
``make up`` runs it:

- the world: the generator's default configuration (1,000 users, 75 followers on average) with
  ``read_heavy_world_events`` events, through the keyed speed layer at the configured threshold;
- then, per write rate ``w`` in ``read_heavy_rates`` (events/s of the generator's default mix:
  52% posts in a long run, ~64% in these short ones, which have no messages to read or posts to
  delete at first), the generator writes at ``w`` while ``hey`` reads one 50-post home timeline
  (the user at the 90th percentile of follow counts) for ``read_heavy_seconds`` on
  ``read_heavy_hey_connections`` connections, closed loop: reads/s is what the API carries beside
  the writes, p50/p99 the latency at that load.

Per row: writes offered, produced and applied by the speed layer per second (its fences' advance
during the reads), posts/s, reads/s, p50/p99, reads per post, how long the speed layer took to
apply the row's last write after the generator stopped, and where the CPU went (redis-server, the
API's workers, the speed layer's driver and JVM, hey, the generator; ``INFO commandstats``: Redis
microseconds per timeline read and per write applied, and per apply call: one call applies a
group of events, and a read arriving meanwhile waits for it; the slowlog's calls over 10 ms). A row meets the profile when p99 <= 50 ms,
reads per post >= 20 and the writes were carried (produced at >= 95% of the offered rate and
applied within 10 s of the last one). ``max_write_rate_reads_p99_within_50ms`` is the highest
offered rate whose row meets it.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from contract.functions import connect as keyed_connect
from pipelines.speed_layer_process import SpeedLayerProcess
from stories.bench_common import (
    BenchContext,
    command_stats,
    process_cpu_s,
    redis_cpu_s,
    section,
    stream_settings,
    wait_applied,
    wait_fences,
)

READ_P99_TARGET_MS = 50.0
READS_PER_POST_FLOOR = 20  # the issue's floor for a read-heavy app (the Locust profile runs 50:1)
WRITES_CARRIED_SHARE = 0.95  # of the offered rate, produced
WRITES_APPLIED_WITHIN_S = 10.0  # the speed layer applied the row's last write this soon after it
LEAD_S = 2.0  # writes flow this long before the reads start (the speed layer at its steady pace)
TAIL_S = 1.0  # ... and this long after the reads end
WORLD_SEED = 0  # the generator's default seed: its graph is the world the rows continue


def reads_per_post(reads_per_s: float, posts_per_s: float) -> float | None:
    """Timeline reads per post written; None when nothing was posted (any read rate qualifies)."""
    return round(reads_per_s / posts_per_s, 1) if posts_per_s > 0 else None


def judge(row: dict) -> dict:
    """The row's verdicts: p99 within 50 ms, >= 20 reads per post, writes carried, and all three."""
    p99 = row.get("p99_ms")
    ratio = row.get("reads_per_post")
    offered = row["write_rate_offered"]
    lag = row.get("applied_lag_s")
    p99_ok = p99 is not None and p99 <= READ_P99_TARGET_MS and row.get("reads_per_s", 0) > 0
    ratio_ok = ratio is None or ratio >= READS_PER_POST_FLOOR
    carried = offered == 0 or (
        row.get("writes_produced_per_s", 0) >= WRITES_CARRIED_SHARE * offered
        and lag is not None
        and lag <= WRITES_APPLIED_WITHIN_S
    )
    return {
        "p99_within_50ms": p99_ok,
        "reads_per_post_at_least_20": ratio_ok,
        "writes_carried": carried,
        "met": p99_ok and ratio_ok and carried,
    }


def max_write_rate(rows: list[dict]) -> int | None:
    """The highest offered write rate whose row met the profile (None: not even without writes)."""
    met = [r["write_rate_offered"] for r in rows if r["met"]]
    return max(met) if met else None


def _slow_calls(r, since: float) -> tuple[int, float | None]:
    """Commands that held Redis for over its slowlog threshold (10 ms by default) since ``since``
    (epoch s): how many (of the last 128 the slowlog keeps) and the longest, ms."""
    slow = [e for e in r.slowlog_get(128) if e["start_time"] >= int(since)]
    return len(slow), (round(max(e["duration"] for e in slow) / 1000, 1) if slow else None)


def _busy_cores() -> float:
    """CPU seconds the whole machine has spent busy (every core, every process)."""
    import psutil

    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def _reader(store, users: list[int]) -> tuple[int, int, int]:
    """The user at the 90th percentile of follow counts with a full (>= 50 entries) home timeline:
    (user, follows, timeline entries)."""
    pipe = store.r.pipeline(transaction=False)
    for u in users:
        pipe.scard(store.k("following", u))
        pipe.zcard(store.k("tl", u))
    got = pipe.execute()
    follows = dict(zip(users, got[0::2], strict=True))
    entries = dict(zip(users, got[1::2], strict=True))
    ranked = sorted((u for u in users if entries[u] >= 50), key=lambda u: (follows[u], u))
    if not ranked:
        raise RuntimeError("no user has a 50-post home timeline: a larger world is needed")
    u = ranked[int(0.9 * (len(ranked) - 1))]
    return u, follows[u], entries[u]


def _row(
    ctx: BenchContext,
    settings,
    topic: str,
    namespace: str,
    rate: int,
    url: str,
    headers: dict,
    pids: dict[str, int | None],
) -> dict:
    """One write rate with the reads beside it."""
    from infra.stack import end_offsets

    r = keyed_connect(settings.redis_url)
    writes = _Writes(settings, topic, rate, ctx.read_heavy_seconds)
    reads = _reads_measured(ctx, r, settings, url, headers, pids)
    produced_per_s = posts_per_s = 0.0
    lag = 0.0
    summary = writes.join()
    if summary is not None:
        produced_per_s = summary.events / summary.seconds
        posts_per_s = summary.per_type.get("post_created", 0) / summary.seconds
        waited = wait_fences(
            r, namespace, end_offsets(settings, topic), ctx.read_heavy_catchup_s, settings.serving_layout
        )
        lag = None if waited is None else round(waited, 1)
    hey, wall, applied = reads.pop("hey"), reads.pop("wall"), reads.pop("applied")
    row = {
        "write_rate_offered": rate,
        "writes_produced_per_s": round(produced_per_s, 1),
        "writes_applied_per_s": round(applied / wall, 1),
        "posts_per_s": round(posts_per_s, 1),
        "reads_per_s": hey["reads_per_s"],
        "p50_ms": hey["p50_ms"],
        "p99_ms": hey["p99_ms"],
        "read_failures": hey["failures"],
        "reads_per_post": reads_per_post(hey["reads_per_s"], posts_per_s),
        "applied_lag_s": lag,  # after the generator's last write: None = not within the timeout
        **reads,
    }
    return {**row, **judge(row)}


class _Writes:
    """The generator writing at ``rate`` (0: not at all) in a thread, ``LEAD_S`` ahead of the reads
    and ``TAIL_S`` after them; constructed once its pacing has started and the lead has passed."""

    def __init__(self, settings, topic: str, rate: int, seconds: float):
        from app_sim.generator import GeneratorConfig, produce

        self.rate = rate
        self.summary: list = []
        self.thread: threading.Thread | None = None
        if not rate:
            return
        started = threading.Event()
        gen = GeneratorConfig(seed=1000 + rate, graph_seed=WORLD_SEED, emit_bootstrap=False, realtime=True)
        n = int(rate * (LEAD_S + seconds + TAIL_S))

        def write() -> None:
            self.summary.append(
                produce(
                    n,
                    gen,
                    topic=topic,
                    bootstrap=settings,
                    rate=rate,
                    progress=False,
                    pause_at=0,  # on_pause runs before the first record: the pacing starts now
                    on_pause=started.set,
                )
            )

        self.thread = threading.Thread(target=write, daemon=True)
        self.thread.start()
        if not started.wait(120):
            raise RuntimeError(f"the generator did not start within 120 s at {rate} events/s")
        time.sleep(LEAD_S)

    def join(self):
        """The generator's summary once it is done (None: no writes)."""
        if self.thread is None:
            return None
        self.thread.join()
        if not self.summary:
            raise RuntimeError(f"the generator failed at {self.rate} events/s")
        return self.summary[0]


def _reads_measured(
    ctx: BenchContext, r, settings, url: str, headers: dict, pids: dict[str, int | None]
) -> dict:
    """hey's reads for ``read_heavy_seconds``, and what the machine spent meanwhile: hey's figures
    (``hey``), the seconds (``wall``), the events the speed layer applied (``applied``), and the
    row's cores and Redis costs (every other key)."""
    from contract import functions
    from infra.hey import run_hey
    from infra.stack import end_offsets

    topic, namespace = settings.events_topic, settings.views_namespace
    stats0, redis0 = command_stats(r), redis_cpu_s(r)
    cpu0 = {name: _cpu_s(pid, name != "bench") for name, pid in pids.items()}
    busy0, since = _busy_cores(), time.time()
    layout, parts = settings.serving_layout, len(end_offsets(settings, topic))
    fence0, t0 = sum(functions.layout_fences(r, namespace, layout, parts).values()), time.monotonic()
    hey = run_hey(
        url, seconds=ctx.read_heavy_seconds, connections=ctx.read_heavy_hey_connections, headers=headers
    )
    wall = time.monotonic() - t0
    busy = (_busy_cores() - busy0) / wall
    slow, longest = _slow_calls(r, since)
    applied = sum(functions.layout_fences(r, namespace, layout, parts).values()) - fence0
    stats1, redis1 = command_stats(r), redis_cpu_s(r)
    cpu = {name: round((_cpu_s(pid, name != "bench") - cpu0[name]) / wall, 2) for name, pid in pids.items()}

    def delta(cmd: str) -> tuple[int, int]:
        c1, u1 = stats1.get(cmd, (0, 0))
        c0, u0 = stats0.get(cmd, (0, 0))
        return c1 - c0, u1 - u0

    reads_calls, reads_usec = delta("fcall_ro")
    apply_calls, apply_usec = delta("fcall")
    return {
        "hey": hey,
        "wall": wall,
        "applied": applied,
        # where the two cores went during the reads (cores; hey's own from its rusage)
        "redis_cores": round((redis1 - redis0) / wall, 2),
        **{f"{name}_cores": v for name, v in cpu.items()},
        "hey_cores": round(hey["hey_cpu_s"] / wall, 2),
        "machine_busy_cores": round(busy, 2),  # everything on the machine, other sessions too
        "redis_us_per_timeline_read": round(reads_usec / reads_calls, 1) if reads_calls else None,
        "redis_us_per_event_applied": round(apply_usec / applied, 1) if applied else None,
        "redis_apply_calls": apply_calls,
        # one call applies a group of events: reads wait behind it (Redis runs one command at a time)
        "redis_ms_per_apply_call": round(apply_usec / apply_calls / 1000, 1) if apply_calls else None,
        "redis_slow_calls": slow,
        "redis_longest_call_ms": longest,
    }


def _cpu_s(pid: int | None, tree: bool) -> float:
    """:func:`process_cpu_s`, 0 for a process that is gone."""
    return process_cpu_s(pid, tree) or 0.0


@section("read_heavy")
def read_heavy_section(ctx: BenchContext) -> dict:
    """Timeline reads under hey beside the generator's writes at rising rates, the speed layer
    running at the default threshold; the highest write rate that keeps reads' p99 <= 50 ms."""
    from contract.functions import drop_namespace
    from infra.stack import ApiServer, free_port_block

    namespace = f"bench_read_heavy_{ctx.run_id}".lower()
    topic = ctx.topic("read_heavy")
    # the API's port below the ephemeral range hey's connections draw from
    settings = stream_settings(ctx, "read_heavy", topic, namespace, api_port=free_port_block(1))
    r = keyed_connect(settings.redis_url)
    sl = SpeedLayerProcess(
        settings, topic, namespace, Path(settings.var_dir) / "speed_layer.log", archive=False
    )
    api = ApiServer(settings)
    out: dict = {
        "fanout_threshold": settings.fanout_threshold,
        "api_workers": settings.api_workers,
        "hey_connections": ctx.read_heavy_hey_connections,
        "seconds_per_row": ctx.read_heavy_seconds,
        "target": f"reads p99 <= {READ_P99_TARGET_MS:g} ms, >= {READS_PER_POST_FLOOR} reads per post, "
        "writes carried",
    }
    sl.start()
    api.start()
    try:
        sl.wait_running()
        world_users = _world(ctx, settings, r, sl.log_path, out)
        # the speed layer's JVM compiles what the catch-up ran for a while after it (bench keyed)
        time.sleep(ctx.read_heavy_settle_s)
        url, headers = _first_read(settings, r, world_users, out)
        pids = {
            "api": api.pid(),  # uvicorn's master and its workers
            "speed_layer": sl.proc.pid if sl.proc else None,  # the Python driver and its JVM
            "bench": os.getpid(),  # the generator's thread (and librdkafka's); not its children
        }
        rows = []
        for rate in ctx.read_heavy_rates:
            row = _row(ctx, settings, topic, namespace, rate, url, headers, pids)
            rows.append(row)
            print(
                f"read_heavy: {rate} events/s offered: {row['reads_per_s']} reads/s, p99 {row['p99_ms']} ms, "
                f"{row['reads_per_post']} reads/post, met={row['met']}",
                flush=True,
            )
        out["rows"] = rows
        out["max_write_rate_reads_p99_within_50ms"] = max_write_rate(rows)
        p99_only = [r_["write_rate_offered"] for r_ in rows if r_["p99_within_50ms"] and r_["writes_carried"]]
        # the same without the reads-per-post floor: how far the latency alone holds
        out["max_write_rate_p99_within_50ms_any_ratio"] = max(p99_only) if p99_only else None
    finally:
        api.stop()
        sl.stop()
        drop_namespace(r, namespace)
    return out


def _world(ctx: BenchContext, settings, r, log_path: Path, out: dict) -> int:
    """The generator's default world (``read_heavy_world_events``) through the speed layer; its
    size and load time into ``out``; its users."""
    from app_sim.generator import GeneratorConfig, produce
    from infra.stack import end_offsets

    t = time.monotonic()
    world = GeneratorConfig(seed=WORLD_SEED, graph_seed=WORLD_SEED, realtime=True)
    topic = settings.events_topic
    summary = produce(ctx.read_heavy_world_events, world, topic=topic, bootstrap=settings, progress=False)
    wait_applied(r, settings, end_offsets(settings, topic), 600, log_path, "apply the world in 10 minutes")
    out["world_events"] = summary.events
    out["world_users"] = world.users
    out["world_load_s"] = round(time.monotonic() - t, 1)
    return world.users


def _first_read(settings, r, users: int, out: dict) -> tuple[str, dict]:
    """The reader (:func:`_reader`) and one read of its timeline (into ``out["reader"]``); the
    URL and headers hey reads it with."""
    import httpx

    from app_sim.auth import TokenSigner, load_secret
    from contract.serving import ServingStore

    store = ServingStore(r, settings.views_namespace)
    user, follows, entries = _reader(store, list(range(1, users + 1)))
    token = TokenSigner(load_secret(settings)).issue(user)
    headers = {"Authorization": f"Bearer {token}"}
    url = f"http://127.0.0.1:{settings.api_port}/v1/timeline?limit=50"
    first = httpx.get(url, headers=headers, timeout=10)
    first.raise_for_status()
    posts = first.json()["posts"]
    out["reader"] = {
        "user_id": user,
        "follows": follows,
        "timeline_entries": entries,
        "posts": len(posts),
        "distinct_authors": len({p["author_id"] for p in posts}),
        "follow_rank": "p90 of the users with a full timeline",
    }
    return url, headers
