"""``make bench`` section ``dedup``: the dedup memory per event, and what a day at 9,000 events/s needs.

The rule (docs/views.md, "Duplicates"): a sequenced event id (``sq:<writer>:<seq>``: the
generator, the API's unkeyed writes) costs its writer R bytes per partition, however many events
it writes; any other id (a UUID: keyed API requests, a log written before sequenced ids) is kept
for the window, so its memory grows with the ids of a day.

Measured: the generator's default log (``--catchup-events``, one writer, its deliberate
duplicates) and a log five times as long from the same writer, each applied by the partitioned
layout's own function (``p_apply``, the one that decides dedup, on this Redis; the deliveries,
which do not touch the dedup memory, are left out) into a namespace of its own; then the
``MEMORY USAGE`` of every dedup key (``dq``, ``dqt``: sequenced; ``seenq``: the others) of every
partition. The same default log with every event id a UUID (as before sequenced ids) is the
contrast. A day at 9,000 events/s is 777.6M events:

- sequenced: ``bytes per writer and partition x writers in the window x partitions`` (it does not
  grow with events: the five-times log must cost what the default log costs);
- any other id: ``bytes per id x ids in the window`` (window + grace: 25 h of ids).
"""

from __future__ import annotations

import dataclasses
import time
import uuid

from stories.bench_common import BenchContext, partition_batches, section

EVENTS_PER_S_A_DAY = 9_000
WINDOW_H = 25  # the dedup window and its grace: the ids one partition remembers at most
PARTITIONS = 8
BUDGET_GIB = 4.0
# writers of one log in 25 h, for the formula: the registry gives at most 1,024 worker ids per log
# (contract/writers.py), so no log can have more
WRITERS_A_DAY = 1_024


def _apply(ctx: BenchContext, namespace: str, per_p: dict[int, list]) -> float:
    """The records through ``p_apply`` in the stream's group size; returns the seconds it took."""
    from pipelines.speed.partitioned import PartitionedProcessor
    from pipelines.speed.stream import processor_config

    cfg = processor_config(ctx.settings, namespace, record_freshness=False)
    proc = PartitionedProcessor(dataclasses.replace(cfg, layout="partitioned"), PARTITIONS)
    started = time.monotonic()
    for p, records in per_p.items():
        for i in range(0, len(records), 5_000):
            proc.process(p, records[i : i + 5_000])
    return time.monotonic() - started


def _dedup_memory(r, namespace: str) -> dict:
    from contract.functions import pkey

    out = {"sequenced_bytes": 0, "writer_states": 0, "opaque_bytes": 0, "opaque_ids": 0}
    for p in range(PARTITIONS):
        dq, dqt, seen = (pkey(namespace, p, name) for name in ("dq", "dqt", "seenq"))
        out["sequenced_bytes"] += (r.memory_usage(dq, samples=0) or 0) + (r.memory_usage(dqt, samples=0) or 0)
        out["writer_states"] += r.hlen(dq)
        out["opaque_bytes"] += r.memory_usage(seen, samples=0) or 0
        out["opaque_ids"] += r.zcard(seen)
    return out


def _as_uuids(records):
    """The log as written before sequenced ids: every event id a UUID (a duplicate keeps its
    original's), each record otherwise the same."""
    ids: dict[str, str] = {}
    for key, value, injected in records:
        if isinstance(value, dict) and isinstance(value.get("event_id"), str):
            value = dict(value, event_id=ids.setdefault(value["event_id"], str(uuid.uuid4())))
        yield key, value, injected


def _measure(ctx: BenchContext, r, label: str, events: int, uuids: bool) -> dict:
    from app_sim.generator import GeneratorConfig, generate
    from contract.functions import drop_namespace

    records = generate(events, GeneratorConfig())
    per_p, _ = partition_batches(_as_uuids(records) if uuids else records, PARTITIONS)
    events_n = sum(len(v) for v in per_p.values())
    namespace = f"bench_dedup_{label}_{ctx.run_id}".lower()
    seconds = _apply(ctx, namespace, per_p)
    mem = _dedup_memory(r, namespace)
    drop_namespace(r, namespace)
    total = mem["sequenced_bytes"] + mem["opaque_bytes"]
    return {
        "events": events_n,
        "event_ids": "uuid" if uuids else "sequenced",
        "apply_s": round(seconds, 1),
        **mem,
        "dedup_bytes": total,
        "dedup_bytes_per_event": round(total / max(events_n, 1), 3),
    }


@section("dedup")
def dedup_section(ctx: BenchContext) -> dict:
    from contract.functions import connect

    r = connect(ctx.settings.redis_url)
    base = ctx.catchup_events
    out: dict = {"partitions": PARTITIONS, "reorder_window": ctx.settings.dedup_reorder}
    out["default"] = _measure(ctx, r, "default", base, uuids=False)
    out["five_times"] = _measure(ctx, r, "five_times", 5 * base, uuids=False)
    out["default_uuid"] = _measure(ctx, r, "default_uuid", base, uuids=True)
    d, f, u = out["default"], out["five_times"], out["default_uuid"]
    out["growth_five_times_sequenced"] = round(f["dedup_bytes"] / max(d["dedup_bytes"], 1), 2)
    per_writer = d["sequenced_bytes"] / max(d["writer_states"], 1)
    per_id = u["opaque_bytes"] / max(u["opaque_ids"], 1)
    day_events = EVENTS_PER_S_A_DAY * 3600 * WINDOW_H
    out["bytes_per_writer_and_partition"] = round(per_writer, 1)
    out["bytes_per_uuid"] = round(per_id, 1)
    out["day_at_9k_sequenced_gib"] = round(per_writer * WRITERS_A_DAY * PARTITIONS / 2**30, 4)
    out["day_at_9k_uuid_gib"] = round(per_id * day_events / 2**30, 1)
    out["formula"] = (
        f"sequenced: {per_writer:.0f} B x {WRITERS_A_DAY} writers x {PARTITIONS} partitions; "
        f"uuid: {per_id:.0f} B x {day_events:,} ids ({EVENTS_PER_S_A_DAY:,}/s for {WINDOW_H} h)"
    )
    out["within_budget_sequenced"] = out["day_at_9k_sequenced_gib"] <= BUDGET_GIB
    return out
