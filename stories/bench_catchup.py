"""``make bench`` section ``catchup``: the generator's default log caught up by the running speed layer.

The work a Kafka Streams peer is compared on (docs/architecture.md, the serving path): the
generator's default 200,000-event log of 1,000 users (``--catchup-events``), produced into a fresh
topic while the speed layer and the archiver run as ``make up`` runs them, timed from the first
record produced until every partition's fence in Redis has reached the log's end. Two or three times, side by
side on one broker and one Redis:

- ``full_fanout``: ``SOCIAL_FANOUT_THRESHOLD`` above every author's follower count, so every post
  is fanned out on write to every follower (the peer's work), in ``SOCIAL_SERVING_LAYOUT``, and
  the same in the other layout (``full_fanout_keyed`` by default);
- ``threshold_10``: authors with more than 10 followers merged at read time (the write-heavy
  choice: nearly every author of this graph), and ``default`` at the configured threshold if it
  is neither (docs/performance.md, "The fan-out threshold").

Each reports events/s, the Redis time per event (redis-server's CPU seconds, user + system, over
the catch-up, divided by the events applied: no reads run meanwhile), the Redis commands per event
inside the library (``INFO commandstats``, without the clients' own calls) and the timeline
entries written per second (the library's ZADD calls), against the 12,000 events/s and 60 µs the
issue sets.
"""

from __future__ import annotations

import time
from pathlib import Path

import redis

from contract.functions import connect as keyed_connect
from pipelines.speed_layer_process import SpeedLayerProcess
from stories.bench_common import (
    CLIENT_COMMANDS,
    BenchContext,
    command_calls,
    redis_cpu_s,
    section,
    stream_settings,
    wait_applied,
)

TARGET_EVENTS_PER_S = 12_000
TARGET_REDIS_US_PER_EVENT = 60
FULL_FANOUT = 1_000_000
WRITE_HEAVY_THRESHOLD = 10  # most authors of the default graph (78 followers on average) merged at read time


def library_commands(r: redis.Redis) -> dict[str, int]:
    """Calls per command since the last reset, the clients' own (:data:`CLIENT_COMMANDS`) left out."""
    return {k: n for k, n in command_calls(r).items() if k not in CLIENT_COMMANDS}


def catch_up(ctx: BenchContext, label: str, threshold: int, events: int, layout: str) -> dict:
    """One catch-up of the default log at ``threshold`` in ``layout``; the speed layer is started
    first and waits for records, as a running stack does."""
    from app_sim.generator import GeneratorConfig, produce
    from contract.functions import drop_namespace
    from infra.stack import end_offsets

    namespace = f"bench_catchup_{label}_{ctx.run_id}".lower()
    topic = ctx.topic(f"catchup_{label}")
    settings = stream_settings(
        ctx, f"catchup_{label}", topic, namespace, fanout_threshold=threshold, serving_layout=layout
    )
    r = keyed_connect(settings.redis_url)
    sl = SpeedLayerProcess(settings, topic, namespace, Path(settings.var_dir) / "speed_layer.log")
    sl.start()
    try:
        sl.wait_running()
        r.config_resetstat()
        cpu0, started = redis_cpu_s(r), time.monotonic()
        summary = produce(events, GeneratorConfig(), topic=topic, bootstrap=settings, progress=False)
        produced_s = time.monotonic() - started
        waited = wait_applied(
            r, settings, end_offsets(settings, topic), 1800, sl.log_path, "catch up in 30 minutes"
        )
        seconds = produced_s + waited
        cpu = redis_cpu_s(r) - cpu0
        calls = library_commands(r)
    finally:
        sl.stop()
        drop_namespace(r, namespace)
    n = summary.events
    return {
        "layout": layout,
        "fanout_threshold": threshold,
        "events": n,
        "produce_s": round(produced_s, 1),
        "catch_up_s": round(seconds, 1),
        "events_per_s": round(n / seconds),
        "redis_cpu_s": round(cpu, 1),
        "redis_us_per_event": round(cpu / n * 1e6, 1),
        "redis_commands_per_event": round(sum(calls.values()) / n, 1),
        "timeline_writes_per_s": round(calls.get("zadd", 0) / seconds),
        "top_commands_per_event": {
            k: round(v / n, 2) for k, v in sorted(calls.items(), key=lambda kv: -kv[1])[:6]
        },
    }


@section("catchup")
def catchup_section(ctx: BenchContext) -> dict:
    """The log caught up fully fanned out (the peer's work) in the default layout and in the other
    one, and with authors over 10 followers merged at read time (the write-heavy choice); also at
    the configured threshold if it is neither."""
    events = ctx.catchup_events
    layout = ctx.settings.serving_layout
    other = "keyed" if layout == "partitioned" else "partitioned"
    out: dict = {"events": events, "layout": layout}
    full = catch_up(ctx, "full_fanout", FULL_FANOUT, events, layout)  # above any follower count
    out["full_fanout"] = full
    out[f"full_fanout_{other}"] = catch_up(ctx, f"full_fanout_{other}", FULL_FANOUT, events, other)
    part, keyed = (
        (full, out["full_fanout_keyed"])
        if layout == "partitioned"
        else (out["full_fanout_partitioned"], full)
    )
    out["partitioned_vs_keyed"] = round(part["events_per_s"] / keyed["events_per_s"], 2)
    out["threshold_10"] = catch_up(ctx, "threshold_10", WRITE_HEAVY_THRESHOLD, events, layout)
    if ctx.settings.fanout_threshold not in (FULL_FANOUT, WRITE_HEAVY_THRESHOLD):
        out["default"] = catch_up(ctx, "default", ctx.settings.fanout_threshold, events, layout)
    out["full_fanout_vs_target"] = round(full["events_per_s"] / TARGET_EVENTS_PER_S, 2)
    out["redis_us_per_event_vs_target"] = round(full["redis_us_per_event"] / TARGET_REDIS_US_PER_EVENT, 2)
    return out
