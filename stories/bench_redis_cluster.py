"""``make bench`` section ``redis_cluster``: timeline writes/s and Redis CPU per timeline write on one
Redis master and on a 3-master Redis Cluster, side by side in one run (issue 63, part 4).

The serving store's work is the timeline inserts of the fan-out (docs/performance.md, "What limits
the throughput"); the partitioned layout was built so that it can be split over masters
(docs/architecture.md, "The partitioned layout" and "On Redis Cluster"). This section measures what
the split gives on this machine, with no Kafka and no Spark, so the figures are the library's and the
processor's own:

- the log: the generator's default log (``--catchup-events``) in ``PARTITIONS`` partitions by the
  producers' partitioner, every post fanned out on write;
- the processors: ``WORKERS`` processes, each owning every ``WORKERS``-th partition, as a micro-batch's
  tasks do: its partitions' next records through ``p_apply`` (``PartitionedProcessor.process``), then
  their outboxes delivered to every partition (``pump``), round after round, unsynchronised;
- the layouts: a plain ``redis-server`` (1 master, the default layout's home) and a real Redis Cluster
  (``infra.redis_cluster.start``, 3 masters, each partition's keys on its slot's owner; ``masters=1``
  the plain one: the stack's own service for both), both this
  section's own, with the cluster nodes' flags (an append-only file each, no RDB) and automatic AOF
  rewrites off (a fork in one run and not in its pair would decide the pair); measured alternately,
  ``pairs`` times (1 master first);
- timeline writes: the entries the log's fan-out implies (:func:`timeline_writes`: each post applied,
  into its author's timeline and each follower's at that point of the log), the same number for both
  layouts; the library keeps no counter of them, and ``INFO commandstats`` counts a ``ZADD`` of a
  round's posts into one timeline once;
- the profile of each run: every node's ``INFO cpu`` (``used_cpu_user`` + ``used_cpu_sys`` of its
  main process) and ``INFO commandstats`` deltas, the processors' own CPU, the whole machine's busy
  cores (other work on it too) and the load average; Redis CPU per timeline write is the nodes' CPU
  summed over the writes;
- the yardstick, in the same run: ``redis-benchmark -t zadd -P 64`` on the single server, on the
  cluster node that owns its key, and over the whole cluster (``--cluster``);
- memory: ``MEMORY USAGE`` per entry of a home timeline of ``SOCIAL_TIMELINE_LENGTH`` entries (and of
  N + S, where a timeline is trimmed back from) as a skiplist (Redis's default over 128 entries) and
  as a listpack, and of the run's own timelines and authors' replicas (``ap`` and bodies).

docs/scaling.md turns the figures into a plan for a Twitter-2013 load.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import shutil
import statistics
import time
import traceback
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path

import orjson
import redis

from infra import clients
from infra.settings import Settings
from stories.bench_common import BenchContext, command_stats, section
from stories.bench_layouts import zadd_yardstick

PARTITIONS = 16  # (--redis-cluster-partitions) 8 would put 2/4/2 on 3 masters by their slots; 16, 6/6/4
WORKERS = 2  # processor processes: one per core of this machine
ROUND_EVENTS = 20_000  # records of one round over all partitions (the layouts section's 8 x 2,500)
PAIRS = 2  # (--redis-cluster-pairs)
MASTERS = 3
FULL_FANOUT = 1_000_000
MEMORY_SAMPLE_KEYS = 2_000  # timelines and replicas whose MEMORY USAGE is summed after a run


# --- the log and the writes it implies ----------------------------------------------------------------


def timeline_writes(records: Iterable[tuple[bytes, dict | bytes, str | None]]) -> dict[str, int]:
    """The timeline entries the log's fan-out implies: each post applied goes into its author's
    timeline and each of the author's followers' at that point of the log (every post fanned out on
    write). Records the processor does not apply (injected duplicates and invalid records, records
    of an erased user: the generator's third field) write nothing. Pure: unit-tested."""
    followers: dict[int, set[int]] = {}
    posts = writes = 0
    for _key, value, injected in records:
        if injected is not None or not isinstance(value, dict):
            continue
        t, u = value["type"], value["user_id"]
        if t == "followed":
            followers.setdefault(value["followee_id"], set()).add(u)
        elif t == "unfollowed":
            followers.get(value["followee_id"], set()).discard(u)
        elif t == "post_created":
            posts += 1
            writes += 1 + len(followers.get(u, ()))
        elif t == "user_erased":  # the user's edges go both ways (docs/views.md, "Erasure")
            followers.pop(u, None)
            for fans in followers.values():
                fans.discard(u)
    return {"posts": posts, "timeline_writes": writes}


def split_log(records, partitions: int) -> tuple[dict[int, list[tuple[int, bytes]]], dict[str, int]]:
    """Generator records as each partition's (offset, value) list, by librdkafka's partitioner
    (``contract.serving.partition_of``), and the writes they imply (one pass over the log)."""
    parts: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
    kept: list = []
    for key, value, injected in records:
        raw = value if isinstance(value, bytes) else orjson.dumps(value)
        p = zlib.crc32(key) % partitions
        parts[p].append((len(parts[p]), raw))
        kept.append((key, value, injected))
    return parts, {"events": len(kept), **timeline_writes(kept)}


# --- the servers --------------------------------------------------------------------------------------


def node_clients(urls: list[str]) -> list[redis.Redis]:
    """One plain client per node (INFO and CONFIG ask one server, never the cluster behind it)."""
    return [clients.redis_client(u, cluster=False) for u in urls]


def prepare(nodes: list[redis.Redis]) -> None:
    """Empty every node (the library stays: FLUSHALL keeps functions), its AOF rewritten small, and
    no automatic AOF rewrite inside a run."""
    for r in nodes:
        r.config_set("auto-aof-rewrite-percentage", 0)
        r.flushall()
        r.bgrewriteaof()
    for r in nodes:
        while int(r.info("persistence").get("aof_rewrite_in_progress", 0)):
            time.sleep(0.05)


# --- one run ------------------------------------------------------------------------------------------


def _worker(cfg, parts: dict, per_round: int, barrier, results) -> None:
    """One processor process: its partitions' rounds (``p_apply`` then ``pump``), timed from the
    barrier the parent passes after its snapshot; puts its end time and CPU on ``results``."""
    from pipelines.speed.partitioned import PartitionedProcessor

    try:
        proc = PartitionedProcessor(cfg, cfg.partitions)
        mine = sorted(parts)
        barrier.wait()  # ready
        barrier.wait()  # go: the parent has taken its snapshot
        cpu0 = time.process_time()
        pos = dict.fromkeys(mine, 0)
        calls = deliveries = 0
        while any(pos[p] < len(parts[p]) for p in mine):
            for p in mine:
                recs = parts[p][pos[p] : pos[p] + per_round]
                if recs:
                    proc.process(p, recs)
                    pos[p] += len(recs)
            done = proc.pump(mine)
            calls += done.calls
            deliveries += done.applied
        results.put(
            {
                "pid": os.getpid(),
                "end": time.monotonic(),
                "cpu_s": time.process_time() - cpu0,
                "deliver_calls": calls,
                "deliveries": deliveries,
            }
        )
    except BaseException:
        results.put({"pid": os.getpid(), "error": traceback.format_exc()})
        raise


def _cpu(r: redis.Redis) -> tuple[float, float]:
    cpu = r.info("cpu")
    return float(cpu["used_cpu_user"]), float(cpu["used_cpu_sys"])


def _machine_busy_s() -> float:
    import psutil

    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def one_run(
    settings: Settings,
    url: str,
    urls: list[str],
    parts: dict[int, list[tuple[int, bytes]]],
    implied: dict[str, int],
    workers: int,
    label: str,
    on_start: Callable[[list[int]], None] | None = None,
) -> dict:
    """The log through ``workers`` processor processes into the store at ``url`` (nodes ``urls``):
    throughput and the profile of every node. ``on_start(pids)``: a profiler to attach (py-spy)."""
    from pipelines.speed.partitioned import PartitionedProcessor
    from pipelines.speed.stream import processor_config

    partitions = len(parts)
    nodes = node_clients(urls)
    prepare(nodes)
    cfg = dataclasses.replace(
        processor_config(settings, f"bench_rc_{label}", record_freshness=False, partitions=partitions),
        redis_url=url,
        layout="partitioned",
        fanout_threshold=FULL_FANOUT,
    )
    check = PartitionedProcessor(cfg, partitions)  # loads the library on every master, once
    per_round = max(1, ROUND_EVENTS // partitions)
    mp = multiprocessing.get_context("spawn")
    barrier, results = mp.Barrier(workers + 1), mp.Queue()
    procs = [
        mp.Process(
            target=_worker,
            args=(cfg, {p: parts[p] for p in range(i, partitions, workers)}, per_round, barrier, results),
            daemon=True,
        )
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    try:
        barrier.wait(timeout=120)  # every worker has its records and its client
        load_before = os.getloadavg()
        cpu0 = [_cpu(r) for r in nodes]
        stats0 = [command_stats(r) for r in nodes]
        busy0 = _machine_busy_s()
        barrier.wait(timeout=30)
        t0 = time.monotonic()
        if on_start is not None:
            on_start([p.pid for p in procs if p.pid is not None])
        got = [results.get(timeout=1800) for _ in procs]
        errors = [g["error"] for g in got if "error" in g]
        if errors:
            raise RuntimeError(f"a processor process failed:\n{errors[0]}")
        wall = max(g["end"] for g in got) - t0
        busy = _machine_busy_s() - busy0
        cpu1 = [_cpu(r) for r in nodes]
        stats1 = [command_stats(r) for r in nodes]
        load_after = os.getloadavg()
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    ends = {p: len(recs) for p, recs in parts.items()}
    whole = check.fences() == ends and check.delivered() == ends
    node_rows = []
    for url_i, c0, c1, s0, s1 in zip(urls, cpu0, cpu1, stats0, stats1, strict=True):
        node_rows.append(node_profile(url_i, c0, c1, s0, s1, wall, implied["events"]))
    processors_cpu = sum(g["cpu_s"] for g in got)
    return summarize(
        masters=len(urls),
        wall_s=wall,
        implied=implied,
        nodes=node_rows,
        processors_cpu_s=processors_cpu,
        machine_busy_s=busy,
        extra={
            "label": label,
            "workers": workers,
            "deliver_calls": sum(g["deliver_calls"] for g in got),
            "applied_everything": whole,
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in load_after],
        },
    )


def node_profile(url: str, cpu0, cpu1, stats0: dict, stats1: dict, wall: float, events: int) -> dict:
    """One node's share of a run: its CPU (user, system), the cores it kept busy, and where its time
    inside the library went (``INFO commandstats`` deltas, the calls themselves apart)."""
    user, sys_ = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
    delta = {
        k: (n - stats0.get(k, (0, 0))[0], u - stats0.get(k, (0, 0))[1])
        for k, (n, u) in stats1.items()
        if n > stats0.get(k, (0, 0))[0]
    }
    fcall = delta.pop("fcall", (0, 0))
    for k in ("info", "config|set", "flushall", "bgrewriteaof", "ping"):
        delta.pop(k, None)
    inner = sorted(delta.items(), key=lambda kv: -kv[1][1])
    return {
        "port": int(url.rsplit(":", 1)[1].split("/")[0]),
        "cpu_s": round(user + sys_, 3),
        "cpu_user_s": round(user, 3),
        "cpu_sys_s": round(sys_, 3),
        "busy_cores": round((user + sys_) / wall, 3) if wall else None,
        "fcall_calls": fcall[0],
        "fcall_s": round(fcall[1] / 1e6, 3),
        "commands_s": round(sum(u for _, (_n, u) in inner) / 1e6, 3),
        "top_commands_per_event": {
            k: {"calls": round(n / events, 3), "us": round(u / events, 2)} for k, (n, u) in inner[:6]
        },
    }


def summarize(
    masters: int,
    wall_s: float,
    implied: dict[str, int],
    nodes: list[dict],
    processors_cpu_s: float,
    machine_busy_s: float,
    extra: dict | None = None,
) -> dict:
    """A run's figures from its measurements: pure arithmetic (unit-tested)."""
    writes, events = implied["timeline_writes"], implied["events"]
    redis_cpu = sum(n["cpu_s"] for n in nodes)
    busiest = max(nodes, key=lambda n: n["cpu_s"])
    return {
        "masters": masters,
        "wall_s": round(wall_s, 3),
        "events_per_s": round(events / wall_s),
        "timeline_writes_per_s": round(writes / wall_s),
        "redis_cpu_s": round(redis_cpu, 3),
        "redis_us_per_timeline_write": round(redis_cpu * 1e6 / writes, 3),
        "redis_us_per_event": round(redis_cpu * 1e6 / events, 1),
        "redis_busy_cores": round(redis_cpu / wall_s, 3),
        "busiest_node_share": round(busiest["cpu_s"] / redis_cpu, 3) if redis_cpu else None,
        "busiest_node_busy_cores": busiest["busy_cores"],
        "processors_cpu_s": round(processors_cpu_s, 3),
        "processors_us_per_timeline_write": round(processors_cpu_s * 1e6 / writes, 3),
        "processors_busy_cores": round(processors_cpu_s / wall_s, 3),
        "machine_busy_cores": round(machine_busy_s / wall_s, 3),
        "nodes": nodes,
        **(extra or {}),
    }


# --- yardstick and memory -----------------------------------------------------------------------------


def yardstick(single, cluster_url: str, cluster_urls: list[str]) -> dict:
    """ZADD throughput of one server, one cluster node (the owner of redis-benchmark's key) and the
    whole cluster, back to back: the machine's pace for Redis's cheapest write, this minute."""
    rc = clients.redis_client(cluster_url)
    owner = rc.get_node_from_key("myzset").port
    rc.close()
    out = {
        "zadd_single_per_s": zadd_yardstick(single.ports[0]),
        "zadd_one_node_per_s": zadd_yardstick(owner),
        "zadd_cluster_per_s": zadd_yardstick(owner, cluster=True),
    }
    for r in node_clients([single.url, *cluster_urls]):
        r.flushall()
    return out


def _timeline_member(i: int) -> str:
    """A timeline member as the library writes it: post id then author id, each padded to 19 digits."""
    pid = 260_000_000_000_000_000 + i * 4_194_304
    return f"{pid:019d}{1_000 + i % 977:019d}"


def zset_bytes_per_entry(r: redis.Redis, entries: int, listpack: bool) -> tuple[float, str]:
    """``MEMORY USAGE`` of a home timeline of ``entries`` posts over its entries, and its encoding:
    Redis's default keeps a sorted set over 128 entries as a skiplist; ``listpack`` raises
    ``zset-max-listpack-entries`` to hold it as one (what a deployment could configure)."""
    key = "bench_rc_memory:tl"
    old = r.config_get("zset-max-listpack-entries")["zset-max-listpack-entries"]
    try:
        if listpack:
            r.config_set("zset-max-listpack-entries", max(entries, int(old)))
        r.delete(key)
        base = 1_767_225_600_000
        for i in range(0, entries, 500):
            r.zadd(key, {_timeline_member(j): base + 977 * j for j in range(i, min(entries, i + 500))})
        used, encoding = r.memory_usage(key, samples=0) or 0, r.object("encoding", key)
    finally:
        r.delete(key)
        r.config_set("zset-max-listpack-entries", old)
    return round(used / entries, 1), encoding.decode() if isinstance(encoding, bytes) else str(encoding)


def held_bytes(r: redis.Redis, namespace: str) -> dict:
    """The run's own state on one server: bytes per entry of its home timelines (``tl``) and of its
    authors' replicas (``ap``, with the bodies ``b`` of the posts they hold), over a sample of
    each (``MEMORY USAGE`` of every key sampled)."""
    out: dict = {}
    for name in ("tl", "ap", "b"):
        keys = []
        for k in r.scan_iter(match=f"{namespace}:{{*}}:{name}:*", count=5_000):
            keys.append(k)
            if len(keys) >= MEMORY_SAMPLE_KEYS:
                break
        pipe = r.pipeline(transaction=False)
        for k in keys:
            pipe.memory_usage(k, samples=0)
            if name != "b":
                pipe.zcard(k)
        got = pipe.execute()
        if name == "b":
            out["bytes_per_body"] = round(sum(got) / len(got), 1) if got else None
            continue
        used, entries = sum(v or 0 for v in got[::2]), sum(got[1::2])
        out[f"{name}_keys_sampled"] = len(keys)
        out[f"{name}_entries_per_key"] = round(entries / len(keys), 1) if keys else None
        out[f"bytes_per_{name}_entry"] = round(used / entries, 1) if entries else None
    return out


# --- the whole measurement ----------------------------------------------------------------------------


def measure(
    settings: Settings,
    home: Path,
    events: int,
    *,
    users: int | None = None,
    workers: int = WORKERS,
    pairs: int = PAIRS,
    partitions: int = PARTITIONS,
    on_start: Callable[[str, list[int]], None] | None = None,
) -> dict:
    """1 master and ``MASTERS`` masters, ``pairs`` times alternately, on servers started under
    ``home`` and stopped (by pid) at the end; ``users``: the generator's (its default when None)."""
    from app_sim.generator import GeneratorConfig, generate
    from contract.functions import pkey
    from infra import redis_cluster
    from pipelines.speed.processor import ProcessorConfig

    gen = GeneratorConfig() if users is None else GeneratorConfig(users=users)
    parts, implied = split_log(generate(events, gen), partitions)
    single = redis_cluster.start(home / "single", masters=1)  # one plain redis-server
    try:
        cluster = redis_cluster.start(home / "cluster", masters=MASTERS)
    except BaseException:
        single.stop()
        raise
    try:
        probe = clients.redis_client(cluster.url)
        slots = {n.port: 0 for n in probe.get_primaries()}
        for p in range(partitions):
            slots[probe.get_node_from_key(pkey("x", p, "fence")).port] += 1
        probe.close()
        out: dict = {
            "events": implied["events"],
            "users": gen.users,
            "partitions": partitions,
            "workers": workers,
            "round_events": ROUND_EVENTS,
            "posts": implied["posts"],
            "timeline_writes": implied["timeline_writes"],
            "timeline_writes_per_post": round(implied["timeline_writes"] / max(implied["posts"], 1), 1),
            "partitions_per_master": sorted(slots.values(), reverse=True),
            "yardstick": yardstick(single, cluster.url, cluster.urls),
        }
        runs = []
        for i in range(pairs):
            for masters, url, urls in ((1, single.url, single.urls), (MASTERS, cluster.url, cluster.urls)):
                label = f"{masters}m_{i + 1}"
                hook = (lambda pids, label=label: on_start(label, pids)) if on_start else None
                run = one_run(settings, url, urls, parts, implied, workers, label, hook)
                run["pair"] = i + 1
                if masters == 1 and i == 0:  # the state one server holds (the same on a cluster, split)
                    run["held"] = held_bytes(node_clients(urls)[0], f"bench_rc_{label}")
                runs.append(run)
        out["runs"] = runs
        out.update(compare(runs))
        r = node_clients([single.url])[0]
        length, slack = settings.timeline_length, ProcessorConfig.timeline_slack
        out["memory"] = {"timeline_length": length, "timeline_slack": slack, **runs[0].get("held", {})}
        for n in (length, length + slack):  # a timeline is trimmed back from N + S
            for listpack in (False, True):
                per, enc = zset_bytes_per_entry(r, n, listpack)
                out["memory"][f"bytes_per_entry_{n}_{enc}"] = per
    finally:
        cluster.stop()
        single.stop()
    return out


def compare(runs: list[dict]) -> dict:
    """Per pair, 3 masters over 1 (timeline writes/s, Redis µs per write), and each layout's median:
    pure arithmetic over :func:`one_run`'s rows (unit-tested)."""
    out: dict = {}
    pairs = sorted({r["pair"] for r in runs})
    ratios_rate, ratios_cost = [], []
    for i in pairs:
        one = next(r for r in runs if r["pair"] == i and r["masters"] == 1)
        many = next(r for r in runs if r["pair"] == i and r["masters"] > 1)
        ratios_rate.append(round(many["timeline_writes_per_s"] / one["timeline_writes_per_s"], 3))
        ratios_cost.append(round(many["redis_us_per_timeline_write"] / one["redis_us_per_timeline_write"], 3))
    out["pairs_writes_per_s_ratio"] = ratios_rate
    out["pairs_redis_us_per_write_ratio"] = ratios_cost
    # the headline (make bench's table shows a section's numbers): the pairs' medians
    out["writes_per_s_three_over_one"] = round(statistics.median(ratios_rate), 3)
    out["redis_us_per_write_three_over_one"] = round(statistics.median(ratios_cost), 3)
    for name, masters in (("one_master", 1), ("three_masters", MASTERS)):
        mine = [r for r in runs if r["masters"] == masters]
        out[name] = {
            key: round(statistics.median(r[key] for r in mine), 3)
            for key in (
                "timeline_writes_per_s",
                "redis_us_per_timeline_write",
                "processors_us_per_timeline_write",
                "redis_busy_cores",
                "processors_busy_cores",
                "machine_busy_cores",
            )
        }
    return out


@section("redis_cluster", standalone=True)
def redis_cluster_section(ctx: BenchContext) -> dict:
    """1 master against a 3-master Redis Cluster on the default log, in one run."""
    home = Path(ctx.settings.var_dir) / "bench" / "redis_cluster" / ctx.run_id
    try:
        return measure(
            ctx.settings,
            home,
            ctx.catchup_events,
            pairs=ctx.redis_cluster_pairs,
            partitions=ctx.redis_cluster_partitions,
        )
    finally:
        shutil.rmtree(home, ignore_errors=True)  # two AOFs of the whole log each run: gigabytes
