"""``make bench`` section ``sealing``: what crypto-shredding costs on the write path (docs/erasure.md).

Side by side in one run, alternating (off then on, then on then off, ...) so that the machine's
noise and any warm-up fall on both alike:

- the generator's events/s into Kafka, sealing off and on (``produce(sealer=...)``), same
  records, same broker, ``rounds`` times each, and the records' mean size (a sealed text is
  random bytes: lz4 no longer shrinks it);
- the API's write throughput, sealing off and on: an API server (``SOCIAL_SEAL_PERSONAL_DATA``
  0 or 1) started afresh for each run, driven for ``api_seconds`` by ``api_concurrency`` asyncio clients posting
  ``POST /v1/posts`` as registered users (every write reads its author's key from the store and
  seals the text).

The target (issue 20): sealing costs <= 10% of either throughput, i.e. the ratio on/off >= 0.9.
The ratio judged is the median over rounds of each round's on/off pair: a pair runs back to
back, so the drift of a shared machine between rounds (an API's runs went 926, 1,017 and 1,167
writes/s over three rounds with sealing off) cancels within it. The pooled ratio (all runs'
throughputs summed) is reported beside it.

Where the generator's time goes, per run, in CPU microseconds per event (``cpu``): its
simulating thread (``main``: simulation, serialisation, produce calls and the sealing), the rest
of its process (``client``: librdkafka's threads compressing and sending), the broker (``broker``,
when its pid file is in this stack's run directory), and the cores left idle on the machine
(``idle_cores``, 0-2 here). CPU time is far less sensitive than a rate to what else runs on a
shared machine, and says whether there was a spare core to hide any of the sealing in.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import resource
import statistics
import time
from pathlib import Path

from stories.bench_common import BenchContext, process_cpu_s, section

_TICKS = os.sysconf("SC_CLK_TCK")


def _machine_idle_s() -> tuple[float, float]:
    """(idle, total) CPU seconds of the whole machine so far, summed over its cores."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return ticks[3] / _TICKS, sum(ticks) / _TICKS


def _broker_pid(ctx: BenchContext) -> int | None:
    try:
        return int((ctx.settings.run_dir / "kafka.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class CpuMeter:
    """CPU microseconds per event of a span of this thread's work (see the module docstring)."""

    def __init__(self, broker_pid: int | None):
        self.broker_pid = broker_pid

    def __enter__(self) -> CpuMeter:
        self.thread = time.thread_time()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self.process = usage.ru_utime + usage.ru_stime
        self.broker = process_cpu_s(self.broker_pid) if self.broker_pid else None
        self.idle, self.total = _machine_idle_s()
        return self

    def __exit__(self, *exc) -> None:
        self.thread = time.thread_time() - self.thread
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self.process = usage.ru_utime + usage.ru_stime - self.process
        broker = process_cpu_s(self.broker_pid) if self.broker is not None else None
        self.broker = broker - self.broker if broker is not None else None
        idle, total = _machine_idle_s()
        self.idle_share = (idle - self.idle) / max(total - self.total, 1e-9)

    def per_event(self, events: int) -> dict:
        us = 1e6 / events
        return {
            "main": round(self.thread * us, 2),
            "client": round((self.process - self.thread) * us, 2),
            "broker": round(self.broker * us, 2) if self.broker is not None else None,
            "idle_cores": round(self.idle_share * (os.cpu_count() or 1), 2),
        }


def _generator_rate(ctx: BenchContext, events: int, sealed: bool, key_dir: Path, i: int) -> dict:
    from app_sim.generator import GeneratorConfig, produce
    from contract.keys import KeyStore, Sealer

    cfg = GeneratorConfig(users=2000, seed=42, invalid_share=0.001, duplicate_share=0.001)
    topic = ctx.topic(f"sealing-gen-{'on' if sealed else 'off'}-{i}")
    sealer = Sealer(KeyStore(key_dir / f"{topic}.sqlite3")) if sealed else None
    with CpuMeter(_broker_pid(ctx)) as cpu:  # the whole call: key preparation and final flush too
        s = produce(events, cfg, topic=topic, bootstrap=ctx.settings, progress=False, sealer=sealer)
    if s.delivery_failures:
        raise RuntimeError(f"{s.delivery_failures} records were not delivered to {topic}")
    return {
        "events_per_s": s.events_per_s,
        "mean_record_bytes": s.mean_record_bytes,
        "cpu_us_per_event": cpu.per_event(events),
    }


async def _drive_writes(base: str, tokens: list[str], seconds: float, concurrency: int) -> dict:
    import httpx

    done = 0
    failed = 0
    stop_at = time.perf_counter() + seconds
    text = "a post of about sixty characters, like most of the generator's"

    async def client(i: int) -> None:
        nonlocal done, failed
        headers = {"Authorization": f"Bearer {tokens[i % len(tokens)]}"}
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as c:
            while time.perf_counter() < stop_at:
                r = await c.post("/v1/posts", json={"text": text})
                if r.status_code == 202:
                    done += 1
                else:
                    failed += 1

    start = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(concurrency)))
    elapsed = time.perf_counter() - start
    return {"writes": done, "failed": failed, "seconds": round(elapsed, 2)}


def _register(base: str, n: int) -> list[str]:
    import httpx

    tokens = []
    with httpx.Client(base_url=base, timeout=30) as c:
        for i in range(n):
            r = c.post("/v1/users", json={"handle": f"seal{i}", "display_name": f"Sealing {i}"})
            r.raise_for_status()
            tokens.append(r.json()["token"])
    return tokens


@section("sealing")
def sealing_section(ctx: BenchContext) -> dict:
    rounds = 5
    events = min(ctx.events, 300_000)
    key_dir = Path(ctx.settings.var_dir) / "bench" / "sealing" / "keys"
    gen: dict[str, list[dict]] = {"off": [], "on": []}
    api: dict[str, list[dict]] = {"off": [], "on": []}
    for i in range(rounds):
        order = ("off", "on") if i % 2 == 0 else ("on", "off")  # neither always goes first
        for mode in order:
            gen[mode].append(_generator_rate(ctx, events, mode == "on", key_dir, i))
        for mode in order:  # one API at a time, started afresh: no idle server beside it
            api[mode].append(_api_rate(ctx, mode, i))
    return _summary(ctx, rounds, events, gen, api)


def _api_rate(ctx: BenchContext, mode: str, i: int) -> dict:
    """Round ``i``'s API write run with sealing ``mode`` (on, off): an API server of its own, 50
    users registered, then ``sealing_api_seconds`` of writes."""
    from infra.stack import ApiServer, free_port_block

    settings = dataclasses.replace(
        ctx.settings,
        events_topic=ctx.topic(f"sealing-api-{mode}-{i}"),
        api_port=free_port_block(1),
        views_namespace=f"bench_sealing_{mode}_{ctx.run_id}".lower(),
        seal_personal_data=1 if mode == "on" else 0,
        var_dir=Path(ctx.settings.var_dir) / "bench" / "sealing" / mode,
    )
    server = ApiServer(settings)
    server.start()
    try:
        base = f"http://127.0.0.1:{settings.api_port}"
        tokens = _register(base, 50)
        return asyncio.run(_drive_writes(base, tokens, ctx.sealing_api_seconds, ctx.sealing_api_concurrency))
    finally:
        server.stop()


def _summary(
    ctx: BenchContext, rounds: int, events: int, gen: dict[str, list[dict]], api: dict[str, list[dict]]
) -> dict:
    """The section's figures from every run: pooled and per-round ratios, CPU per event, verdict."""

    def gen_rate(mode: str) -> float:
        runs = gen[mode]
        return round(rounds * events / sum(events / r["events_per_s"] for r in runs))

    def api_rate(mode: str) -> float:
        runs = api[mode]
        return round(sum(r["writes"] for r in runs) / sum(r["seconds"] for r in runs), 1)

    def paired(runs: dict[str, list[dict]], rate) -> list[float]:
        return [round(rate(on) / rate(off), 3) for on, off in zip(runs["on"], runs["off"], strict=True)]

    def cpu(mode: str, part: str) -> float | None:
        values = [r["cpu_us_per_event"][part] for r in gen[mode]]
        return None if None in values else round(statistics.median(values), 2)

    gen_cpu = {mode: {part: cpu(mode, part) for part in ("main", "client", "broker")} for mode in gen}
    gen_pairs = paired(gen, lambda r: r["events_per_s"])
    api_pairs = paired(api, lambda r: r["writes"] / r["seconds"])
    gen_ratio = statistics.median(gen_pairs)
    api_ratio = statistics.median(api_pairs)
    return {
        "generator_events": events,
        "rounds": rounds,
        "generator_events_per_s_plain": gen_rate("off"),
        "generator_events_per_s_sealed": gen_rate("on"),
        "generator_ratio_sealed_vs_plain": gen_ratio,
        "generator_ratio_per_round": gen_pairs,
        "generator_ratio_pooled": round(gen_rate("on") / gen_rate("off"), 3),
        "generator_mean_record_bytes_plain": gen["off"][0]["mean_record_bytes"],
        "generator_mean_record_bytes_sealed": gen["on"][0]["mean_record_bytes"],
        # medians over rounds, CPU us per event: what sealing adds to the simulating thread, and
        # how many cores sat idle while it ran (a spare core is what moving work off it needs)
        "generator_cpu_us_per_event_plain": gen_cpu["off"],
        "generator_cpu_us_per_event_sealed": gen_cpu["on"],
        "generator_main_thread_cpu_ratio": round(gen_cpu["off"]["main"] / gen_cpu["on"]["main"], 3),
        "generator_idle_cores_median": statistics.median(
            r["cpu_us_per_event"]["idle_cores"] for m in gen.values() for r in m
        ),
        "api_concurrency": ctx.sealing_api_concurrency,
        "api_writes_per_s_plain": api_rate("off"),
        "api_writes_per_s_sealed": api_rate("on"),
        "api_ratio_sealed_vs_plain": api_ratio,
        "api_ratio_per_round": api_pairs,
        "api_ratio_pooled": round(api_rate("on") / api_rate("off"), 3),
        "api_failed_writes": sum(r["failed"] for m in api.values() for r in m),
        "generator_runs": gen,
        "api_runs": api,
        "target": "sealing costs <= 10% of the generator's and the API's write throughput",
        "target_met": gen_ratio >= 0.9 and api_ratio >= 0.9,
    }
