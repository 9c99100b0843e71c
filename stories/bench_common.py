"""What ``make bench``'s sections share: the registry, the run's context and the helpers.

:mod:`stories.bench` (the runner, with the ``ingest`` and ``serving`` sections) and every section
module (``stories/bench_*.py``) import from here; this module imports no section, so no import
runs in a circle. A section is a function ``(BenchContext) -> dict`` registered with
``@section(name)``; sections run in registration order.

The helpers are the one copy of what more than one story measures or waits for: percentiles of a
list (:func:`pct`), redis-server's CPU and per-command counts (:func:`redis_cpu_s`,
:func:`command_stats`, :func:`command_calls`, :func:`library_calls`), a process's CPU
(:func:`process_cpu_s`), the speed layer's fences reaching a position (:func:`wait_fences`,
:func:`wait_applied`), a section's own stream (:func:`stream_settings`, :func:`fill_topic`), a
log split into per-partition batches and the keyed processor as the settings configure it
(:func:`partition_batches`, :func:`keyed_processor`), and a broker for a run that finds none
(:func:`backbone_unless_running`). Other stories (``stories/compare.py``, ``stories/faults.py``)
import them from here too; what a lower floor owns is imported from there (free ports:
:func:`infra.stack.free_port_block`; end offsets: :func:`infra.stack.end_offsets`; a histogram's
percentile: :func:`pipelines.metrics.percentile`).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import redis

from infra.settings import Settings

SECTIONS: dict[str, Callable[[BenchContext], dict]] = {}
# sections that start every server they measure and need no broker: a run of only these starts no stack
STANDALONE: set[str] = set()


def section(name: str, standalone: bool = False):
    """Register a benchmark section (runs in registration order); ``standalone``: it starts what it
    measures itself, so a run of only such sections starts no Kafka (:func:`backbone_unless_running`)."""

    def register(fn):
        SECTIONS[name] = fn
        if standalone:
            STANDALONE.add(name)
        return fn

    return register


@dataclass
class BenchContext:
    settings: Settings
    events: int
    run_id: str = field(default_factory=lambda: datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"))
    topics: list[str] = field(default_factory=list)
    serving_users: int = 50
    serving_seconds: int = 30
    serving_hey_seconds: int = 15  # serving: each hey run (one user's timeline, fixed duration)
    serving_hey_connections: int = 32  # serving: hey's connections (Little: 3,000/s x ~10 ms in flight)
    freshness_p99_target_ms: int = 5_000
    ryw_writes: int = 50  # keyed: read-your-write samples, idle and under load
    ryw_settle_s: float = 30.0  # keyed: quiet time after the catch-up before the idle samples
    ryw_load_rate: int = 5_000
    keyed_rates: tuple[int, ...] = (1_000, 5_000, 10_000)
    keyed_seconds: int = 120
    scaling_state_events: int = 20_000
    scaling_probe_events: int = 5_000
    analytics_rate: int = 2_000  # the target rate for the analytics beside the speed layer
    analytics_seconds: int = 120  # per phase; the curves cover the second one
    analytics_alone_seconds: int | None = None  # the first phase's, if shorter (a long curves run)
    compacted_batch: int = 500  # compacted topics: records per partition per micro-batch
    compacted_ab_rate: int = 2_000  # compacted topics: the speed layer's load, publisher off and on
    compacted_ab_seconds: int = 30
    batch_events: int = 1_000_000  # the batch layer's 10x log; 1x and 3x are a tenth and 3 tenths
    cluster_rate: int = 1_000  # cluster_scaling: the fixed rate each configuration's freshness is at
    cluster_seconds: int = 60
    cluster_burst_events: int = 60_000  # cluster_scaling: the backlog whose drain is the throughput
    sealing_api_seconds: int = 15  # sealing: each API write run (off, on, off, on)
    sealing_api_concurrency: int = 32  # sealing: asyncio clients posting at once
    erasure_log_events: int = 1_000_000  # erasure: the log the 10,000-event user is erased from
    catchup_events: int = 200_000  # catchup: the generator's default log, caught up at two thresholds
    archive_events: int = 1_000  # archive: the events archived and compacted on a lake holding that log
    read_heavy_rates: tuple[int, ...] = (0, 30, 100, 300, 1_000, 3_000)  # read_heavy: writes, events/s
    read_heavy_seconds: int = 15  # read_heavy: hey's reads at each write rate
    # read_heavy: hey's connections. Fewer than serving's 32 (sized for 3,000 reads/s): a closed
    # loop queues connections / rate by itself (Little), 32 / 600 reads/s = 53 ms on this machine
    # beside the speed layer; 8 keep that near 13 ms, so p99 shows what the writes add
    read_heavy_hey_connections: int = 8
    read_heavy_settle_s: int = 20  # read_heavy: quiet time after the world's catch-up (JIT)
    read_heavy_world_events: int = 100_000  # read_heavy: the default generator's world before the rows
    read_heavy_catchup_s: int = 60  # read_heavy: wait this long for a row's writes to be applied
    redis_cluster_partitions: int = 16  # redis_cluster: the log's partitions (8 puts 2/4/2 on 3 masters)
    redis_cluster_pairs: int = 2  # redis_cluster: 1-master and 3-master runs, alternately

    @property
    def analytics_first_phase_s(self) -> int:
        """The analytics bench's first phase (without the analytics), in seconds."""
        return self.analytics_alone_seconds or self.analytics_seconds

    def topic(self, purpose: str, partitions: int | None = None) -> str:
        """A fresh topic for this run (deleted at the end), with the event topic's partition count."""
        from infra.stack import create_topic

        name = f"bench.{purpose}.{self.run_id}".lower()
        create_topic(self.settings, name, partitions or self.settings.events_partitions)
        self.topics.append(name)
        return name

    def cleanup(self) -> None:
        from infra.stack import delete_topic

        for name in self.topics:
            try:
                delete_topic(self.settings, name)
            except Exception as exc:  # cleanup must not hide the results
                print(f"warning: could not delete topic {name}: {exc}", file=sys.stderr)


# --- helpers the sections share -------------------------------------------------------------------------


def stream_settings(ctx: BenchContext, purpose: str, topic: str, namespace: str, **overrides) -> Settings:
    """The settings of a section's own stream: its topic, its views namespace, its var directory
    (``<var>/bench/<purpose>``), and whatever else the section sets (a port, a threshold)."""
    return dataclasses.replace(
        ctx.settings,
        events_topic=topic,
        views_namespace=namespace,
        var_dir=Path(ctx.settings.var_dir) / "bench" / purpose,
        **overrides,
    )


def fill_topic(ctx: BenchContext, purpose: str, events: int, users: int, **gen) -> tuple[str, object]:
    """A fresh topic (:meth:`BenchContext.topic`) holding ``events`` generator events of ``users``
    users (seed 3, ``gen``: more of the generator's config); the topic and the generator's summary."""
    from app_sim.generator import GeneratorConfig, produce

    topic = ctx.topic(purpose)
    cfg = GeneratorConfig(users=users, seed=3, **gen)
    summary = produce(events, cfg, topic=topic, bootstrap=ctx.settings, progress=False)
    return topic, summary


def pct(values: list[float], q: float, digits: int = 1) -> float | None:
    """The ``q`` quantile of ``values`` (the value at rank ``int(q * n)``, none interpolated),
    rounded to ``digits``; None for no values."""
    if not values:
        return None
    v = sorted(values)
    return round(v[min(len(v) - 1, int(q * len(v)))], digits)


def redis_cpu_s(r: redis.Redis) -> float:
    """redis-server's CPU seconds so far (user + system, its main thread and the rest): over a run,
    the Redis time a section reports per event or per read."""
    cpu = r.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


# What clients send around the library's work: the calls themselves, the bench's INFO and polls
# of the fences, the API's reads, the processor's freshness counters, a CONFIG RESETSTAT.
CLIENT_COMMANDS = frozenset({"fcall", "fcall_ro", "info", "ping", "hgetall", "hincrby", "config|resetstat"})


def command_stats(r: redis.Redis) -> dict[str, tuple[int, int]]:
    """``INFO commandstats``: per command, (calls, microseconds) since redis-server started or its
    last ``CONFIG RESETSTAT`` (of a Redis Cluster, every master's: :func:`contract.functions.command_stats`)."""
    from contract.functions import command_stats as info_commandstats

    return {
        k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"])) for k, v in info_commandstats(r).items()
    }


def command_calls(r: redis.Redis) -> dict[str, int]:
    """Per command, the calls of :func:`command_stats`."""
    return {k: calls for k, (calls, _usec) in command_stats(r).items()}


def library_calls(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Per command, the calls between two :func:`command_calls` made inside the library's
    functions (:data:`CLIENT_COMMANDS` left out)."""
    calls = {k: n - before.get(k, 0) for k, n in after.items() if k not in CLIENT_COMMANDS}
    return {k: n for k, n in calls.items() if n > 0}


def process_cpu_s(pid: int | None, tree: bool = False) -> float | None:
    """CPU seconds (user + system) of a process so far, with its live descendants' if ``tree``;
    None when there is no such process (gone, reaped, or no pid)."""
    import psutil

    if pid is None:
        return None
    try:
        root = psutil.Process(pid)
        procs = [root, *(root.children(recursive=True) if tree else ())]
    except psutil.NoSuchProcess:
        return None
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:  # a descendant that ended meanwhile
            pass
    return total


def wait_fences(
    r: redis.Redis, namespace: str, ends: dict[int, int], timeout_s: float, layout: str = "keyed"
) -> float | None:
    """Seconds until every partition's fence reaches ``ends`` (None: not within the timeout); in the
    partitioned layout, with every delivery caused below ``ends`` applied too."""
    from contract import functions

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        f = functions.layout_fences(r, namespace, layout, len(ends))
        if all(f.get(p, 0) >= o for p, o in ends.items()):
            return time.monotonic() - t0
        time.sleep(0.05)
    return None


def wait_applied(
    r: redis.Redis,
    settings: Settings,
    ends: dict[int, int],
    timeout_s: float,
    log_path,
    what: str = "catch up",
) -> float:
    """:func:`wait_fences` for the speed layer of ``settings`` (its views namespace and layout):
    the seconds it took, or a RuntimeError, "the speed layer did not <what>; see <log_path>"."""
    waited = wait_fences(r, settings.views_namespace, ends, timeout_s, settings.serving_layout)
    if waited is None:
        raise RuntimeError(f"the speed layer did not {what}; see {log_path}")
    return waited


def reset_freshness(r: redis.Redis, namespace: str, layout: str, partitions) -> None:
    """Empty the speed layer's freshness histogram (one per partition in the partitioned layout)."""
    from contract import functions

    if layout == "partitioned":
        r.delete(*[functions.pkey(namespace, p, "freshness") for p in partitions])
    else:
        r.delete(functions.key(namespace, "freshness"))


def partition_batches(records, parts: int, offsets: dict[int, int] | None = None):
    """Generator records (``generate``'s) as one batch per partition (key modulo ``parts``) of
    (offset, bytes), each offset continuing ``offsets`` (partition -> next offset; none: from 0):
    the batches, and the offsets after them."""
    import orjson

    per_p: dict[int, list] = {}
    offsets = dict(offsets or {})
    for key, value, _ in records:
        p = int(key) % parts
        o = offsets.get(p, 0)
        offsets[p] = o + 1
        per_p.setdefault(p, []).append((o, value if isinstance(value, bytes) else orjson.dumps(value)))
    return per_p, offsets


def keyed_processor(settings: Settings, namespace: str, **overrides):
    """The keyed layout's processor (``social.lua``) into ``namespace`` as the stack's settings
    configure it (:func:`pipelines.speed.stream.processor_config`), without the freshness
    histogram; ``overrides``: fields of its config (a fan-out threshold)."""
    from pipelines.speed.processor import Processor
    from pipelines.speed.stream import processor_config

    cfg = processor_config(settings, namespace, record_freshness=False)
    return Processor(dataclasses.replace(cfg, layout="keyed", **overrides))


@contextmanager
def backbone_unless_running(settings: Settings, purpose: str) -> Iterator[None]:
    """The running local stack if Kafka answers on the configured port; else Kafka and Redis
    (``infra.stack.BACKBONE``) started for ``purpose`` and stopped afterwards."""
    from infra.stack import BACKBONE, Stack, port_listening

    stack = None
    if not port_listening(settings.kafka_port):
        print(f"no broker running: starting Kafka and Redis for the {purpose}", file=sys.stderr)
        stack = Stack(settings, service_types=BACKBONE)
        stack.up()
    try:
        yield
    finally:
        if stack is not None:
            stack.down()
