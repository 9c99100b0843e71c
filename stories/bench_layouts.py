"""``make bench`` section ``layouts``: the keyed and the partitioned layout's Redis cost, side by side.

No Kafka and no Spark: the same records go straight through each processor into the bench's Redis,
so the figures are the libraries' own (docs/architecture.md, "The partitioned layout"):

- the yardstick: ``redis-benchmark -t zadd -P 64`` on the same Redis in the same run;
- the library: the generator's default log (``--catchup-events``, 200,000 events of 1,000 users)
  in 8 partitions by the producers' partitioner, applied in micro-batches of 2,500 records per
  partition, round robin, every post fanned out on write (the partitioned processor delivers the
  outboxes after each round, as a micro-batch's task does), each layout twice, alternating: Redis CPU per event (``INFO
  cpu``) and per command (``INFO commandstats``: calls and µs per event, so where every µs goes),
  timeline entries per event and Redis memory per timeline entry (``MEMORY USAGE`` of every
  timeline over its entries);
- reads: a 50-post home timeline read by a reader who follows 50 fanned-out authors, and by one
  who follows 45 of them and 5 authors above the threshold (merged at read time), 2,000 reads each:
  Redis µs per read (``INFO commandstats``, ``fcall_ro``), in both layouts.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
import zlib

import orjson
import redis

from infra import clients
from stories.bench_common import BenchContext, command_stats, redis_cpu_s, section

PARTITIONS = 8
BATCH = 2_500  # records per partition per micro-batch (the stream's order of magnitude)
LAYOUTS = ("keyed", "partitioned", "keyed", "partitioned")


def zadd_yardstick(port: int, requests: int = 1_000_000, *, cluster: bool = False) -> float | None:
    """``redis-benchmark -t zadd -P 64``: pipelined ZADDs per second on this Redis, this minute
    (``cluster``: ``--cluster``, over every master of the cluster behind ``port``)."""
    exe = shutil.which("redis-benchmark")
    if exe is None:
        return None
    out = subprocess.run(
        [exe, "-p", str(port), *(["--cluster"] if cluster else []), "-t", "zadd", "-P", "64"]
        + ["-n", str(requests), "-q"],
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    rates = re.findall(r"ZADD: ([\d.]+) requests per second", out.replace("\r", "\n"))
    return float(rates[-1]) if rates else None


def _log(events: int) -> dict[int, list[tuple[int, bytes]]]:
    from app_sim.generator import EventGenerator, GeneratorConfig

    parts: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(PARTITIONS)}
    for key, value, _ in EventGenerator(events, GeneratorConfig()).records():
        raw = value if isinstance(value, bytes) else orjson.dumps(value)
        p = zlib.crc32(key) % PARTITIONS  # librdkafka's default partitioner (contract.serving.partition_of)
        parts[p].append((len(parts[p]), raw))
    return parts


def _processor(r: redis.Redis, layout: str, namespace: str, threshold: int):
    from pipelines.speed.partitioned import PartitionedProcessor
    from pipelines.speed.processor import Processor, ProcessorConfig

    cfg = ProcessorConfig(
        redis_url="unused",
        namespace=namespace,
        fanout_threshold=threshold,
        record_freshness=False,
        layout=layout,
        partitions=PARTITIONS,
    )
    if layout == "partitioned":
        return PartitionedProcessor(cfg, PARTITIONS, client=r)
    return Processor(cfg, client=r)


def _apply(proc, layout: str, parts: dict[int, list[tuple[int, bytes]]]) -> None:
    pos = dict.fromkeys(parts, 0)
    while any(pos[p] < len(parts[p]) for p in parts):
        for p in sorted(parts):  # a micro-batch: every partition's next records
            recs = parts[p][pos[p] : pos[p] + BATCH]
            if recs:
                proc.process(p, recs)
                pos[p] += len(recs)
        if layout == "partitioned":  # then their deliveries, as the stream's task does
            proc.pump(parts)


def _timeline_memory(r: redis.Redis, namespace: str) -> tuple[int, int]:
    """(entries, bytes) over every home timeline of the namespace."""
    entries = used = 0
    for pattern in (f"{namespace}:tl:*", f"{namespace}:{{*}}:tl:*"):
        keys = list(r.scan_iter(match=pattern, count=5000))
        for i in range(0, len(keys), 1000):
            pipe = r.pipeline(transaction=False)
            for k in keys[i : i + 1000]:
                pipe.zcard(k)
                pipe.memory_usage(k, samples=0)
            got = pipe.execute()
            entries += sum(got[::2])
            used += sum(v or 0 for v in got[1::2])
    return entries, used


def library_run(r: redis.Redis, layout: str, parts, events: int, namespace: str) -> dict:
    from contract.functions import drop_namespace

    proc = _processor(r, layout, namespace, threshold=1_000_000)  # every post fanned out on write
    r.config_resetstat()
    cpu0, t0 = redis_cpu_s(r), time.perf_counter()
    _apply(proc, layout, parts)
    wall, cpu = time.perf_counter() - t0, redis_cpu_s(r) - cpu0
    stats = command_stats(r)
    entries, used = _timeline_memory(r, namespace)
    drop_namespace(r, namespace)
    inner = {k: v for k, v in stats.items() if k not in ("fcall", "fcall_ro", "info", "config|resetstat")}
    return {
        "layout": layout,
        "redis_us_per_event": round(cpu / events * 1e6, 1),
        "driver_events_per_s": round(events / wall),  # Python and Redis on one machine: not the stream's
        "fcall_us_per_event": round(stats.get("fcall", (0, 0))[1] / events, 1),
        "commands_us_per_event": round(sum(u for _, u in inner.values()) / events, 1),
        "top_commands_per_event": {
            k: {"calls": round(n / events, 2), "us": round(u / events, 2)}
            for k, (n, u) in sorted(inner.items(), key=lambda kv: -kv[1][1])[:8]
        },
        "timeline_entries_per_event": round(entries / events, 1),
        "bytes_per_timeline_entry": round(used / entries, 1) if entries else None,
    }


def _event(i: int, type_: str, user: int, t: int, **fields) -> bytes:
    base = {"event_id": f"r{i}", "type": type_, "schema_version": 1, "user_id": user}
    return orjson.dumps({**base, "device_time": t + i, "sent_time": t + i, "received_time": t + i, **fields})


def read_world(r: redis.Redis, layout: str, namespace: str) -> tuple[object, dict[str, int]]:
    """Two readers (ids 1 and 2) in one partition: both follow 45 authors fanned out on write; reader 2
    also follows 5 authors with more followers than the threshold (100) in that partition. Every
    author has 60 posts. Returns the processor and the readers' partition."""
    from contract.serving import partition_of

    proc = _processor(r, layout, namespace, threshold=100)
    t = int(time.time() * 1000) - 10_000_000
    home = partition_of(1, PARTITIONS)
    readers = [u for u in range(1, 100_000) if partition_of(u, PARTITIONS) == home][:2]
    fans = [u for u in range(100_000, 200_000) if partition_of(u, PARTITIONS) == home][:101]
    fanned, celebs = list(range(1_000, 1_045)), list(range(2_000, 2_005))
    per_p: dict[int, list[bytes]] = {}
    i = 0

    def emit(key_user: int, raw: bytes) -> None:
        per_p.setdefault(partition_of(key_user, PARTITIONS), []).append(raw)

    for a in fanned + celebs:
        for u in readers if a in fanned else readers[1:]:
            i += 1
            emit(u, _event(i, "followed", u, t, followee_id=a))
    for a in celebs:
        for f in fans:
            i += 1
            emit(f, _event(i, "followed", f, t, followee_id=a))
    for k in range(60):
        for a in fanned + celebs:
            i += 1
            emit(a, _event(i, "post_created", a, t, post_id=a * 1000 + k, text="x" * 80))
    for p, raws in per_p.items():
        for j in range(0, len(raws), BATCH):
            proc.process(p, list(enumerate(raws))[j : j + BATCH])
    if layout == "partitioned":
        proc.settle()
    return proc, {"plain": readers[0], "with_celebrities": readers[1]}


def read_cost(r: redis.Redis, layout: str, namespace: str, reads: int = 2_000) -> dict:
    from contract.functions import drop_namespace, pkey
    from contract.serving import partition_of

    _proc, readers = read_world(r, layout, namespace)
    out: dict = {}
    for name, u in readers.items():
        if layout == "partitioned":
            p = partition_of(u, PARTITIONS)
            args = ("p_timeline", 1, pkey(namespace, p, "fence"), namespace, p, u, 50)
        else:
            args = ("social_timeline", 0, namespace, u, 50)
        got = r.fcall_ro(*args)
        r.config_resetstat()
        for _ in range(reads):
            r.fcall_ro(*args)
        calls, usec = command_stats(r)["fcall_ro"]
        out[name] = {"posts": len(got[1]), "redis_us_per_read": round(usec / calls, 1)}
    drop_namespace(r, namespace)
    return out


@section("layouts")
def layouts_section(ctx: BenchContext) -> dict:
    """The keyed and the partitioned layout on the same records and reads, in one run."""
    from contract import functions

    r = clients.redis_client(ctx.settings.redis_url)
    functions.ensure_loaded(r)
    functions.ensure_partitioned_loaded(r)
    out: dict = {"zadd_pipelined_per_s": zadd_yardstick(ctx.settings.redis_port)}
    r.delete("key:__rand_int__", "myzset")  # what redis-benchmark leaves behind
    events = ctx.catchup_events
    parts = _log(events)
    runs = [
        library_run(r, layout, parts, events, f"bench_layouts_{i}_{ctx.run_id}".lower())
        for i, layout in enumerate(LAYOUTS)
    ]
    out["library"] = runs
    for layout in ("keyed", "partitioned"):
        mine = [x["redis_us_per_event"] for x in runs if x["layout"] == layout]
        out[f"{layout}_redis_us_per_event"] = min(mine)
    out["partitioned_vs_keyed_redis_time"] = round(
        out["partitioned_redis_us_per_event"] / out["keyed_redis_us_per_event"], 2
    )
    out["reads"] = {
        layout: read_cost(r, layout, f"bench_reads_{layout}_{ctx.run_id}".lower())
        for layout in ("keyed", "partitioned")
    }
    return out
