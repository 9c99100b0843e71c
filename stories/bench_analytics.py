"""``make bench`` section ``analytics``: the stream analytics beside the keyed speed layer.

Two phases, one after the other on one broker and one Redis, each on its own topic and
namespace, each the same generated traffic: registrations and follows of 2,000 users (not
measured), then ``analytics_rate`` events/s of the default mix for ``analytics_seconds``:

1. the keyed speed layer alone (``python -m pipelines.speed_layer``, as in the
   ``keyed`` section, :class:`pipelines.speed_layer_process.SpeedLayerProcess`);
2. the same, with every analytics query (:data:`pipelines.analytics.runner.QUERIES`) running
   beside it as ``make up``'s analytics service runs them (``python -m pipelines.analytics``: its
   own process and JVM at nice 10, the settings' trigger), and the three alert patterns injected every 15 s. The load
   starts once every query has finished a micro-batch that read the bootstrap (their start-up,
   minutes on a busy machine, is not steady state), or after ``WARM_UP_S``.

Between the phases the first phase's keys are dropped and Redis's AOF rewritten, so the second
phase starts from the same Redis as the first (each phase also reports its Redis forks, the AOF
rewrites that grow with the dataset, and the memory it ended with).

Measured:

- the speed layer's freshness (server receive -> applied in Redis) p50/p99 in each phase, from
  the processor's own histogram ``<namespace>:freshness`` (:func:`pipelines.verify.keyed_freshness`,
  reset once the bootstrap is applied), and the ratio with/without (target: <= 1.5). The
  histogram stops at 120 s (``FRESHNESS_CAP_MS``): when the speed layer falls behind the rate,
  p99 sits at the cap in both phases and the ratio says nothing, so each phase also gives how
  long after the load it caught up with the log's end and the rate it applied (events over the
  load's time plus that lag), with their ratio;
- how long after the load every analytics query had read it (their own lag), and the median of
  each part of Spark's ``durationMs`` over their micro-batches (where a batch's time goes);
- the analytics' own end-to-end latency: an alert's record time on the alerts topic - the
  receive time of the newest event that fired it; a tumbling window's Delta commit time - its
  window end (the newest event of a window is received just before its end, and the row cannot
  be written before the watermark, ``ANALYTICS_LATENESS_S`` later, passes it);
- over phase 2, every 5 s: the state rows and bytes of every stateful query (``stateOperators``
  of the last progress), and every micro-batch's duration (``triggerExecution``): the curves
  are in the JSON and plotted in ``var/reports/bench/analytics_curves.png``; "flat" compares
  the medians of the first and last thirds.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC
from pathlib import Path

import redis

from contract.functions import connect as keyed_connect
from infra import clients
from infra.settings import Settings
from pipelines.report import png_bytes
from pipelines.speed.processor import FRESHNESS_CAP_MS
from pipelines.speed_layer_process import SpeedLayerProcess
from stories.bench_common import (
    BenchContext,
    pct,
    redis_cpu_s,
    reset_freshness,
    section,
    wait_applied,
    wait_fences,
)

ANALYTICS_LATENESS_S = 10  # so windows close within the run (the default, 120 s, would not)
BOOT_USERS, BOOT_FOLLOWERS, GRAPH_SEED = 2_000, 20, 13
PATTERN_USER = 10_000_000  # a user the generated traffic never uses
SAMPLE_S = 5
WARM_UP_S = 420  # longest wait for every analytics query to have read the bootstrap
CATCH_UP_S = 600  # longest wait, after the load, for the speed layer to cover the log's end


def _generator(seed: int, bootstrap: bool):
    from app_sim.generator import GeneratorConfig

    return GeneratorConfig(
        users=BOOT_USERS,
        seed=seed,
        graph_seed=GRAPH_SEED,
        mean_followers=BOOT_FOLLOWERS,
        realtime=True,
        emit_bootstrap=bootstrap,
    )


class _AnalyticsBeside:
    """``python -m pipelines.analytics`` beside the speed layer, as ``make up`` runs it (its own
    process and JVM, nice 10, the settings' trigger); from its progress file
    (:class:`pipelines.analytics.runner.ProgressLog`) it samples the queries every 5 s, and it
    injects the alert patterns every 15 s, from measure() to stop()."""

    def __init__(self, spark, settings: Settings, namespace: str):
        from pipelines.analytics.runner import Paths, ProgressLog

        self.spark, self.settings, self.namespace = spark, settings, namespace
        self.paths = Paths.for_namespace(settings, namespace)
        self.progress_path = ProgressLog.path_for(settings, namespace)
        self.log_path = Path(settings.log_dir) / f"analytics-{namespace}.log"
        self.proc: subprocess.Popen | None = None
        self.samples: list[dict] = []
        self.batches: dict[tuple[str, int], dict] = {}  # (query, batch id) -> its progress
        self.measuring_since: float | None = None
        self.done = threading.Event()
        self.threads: list[threading.Thread] = []
        self.injected = 0
        self.caught_up: bool | None = None  # every query read the whole load (after it)
        self.caught_up_after_s: float | None = None
        self._read_to = 0  # bytes of the progress file already parsed
        self._lock = threading.Lock()  # the sampler and wait_read both read the progress file
        self._last: dict[str, dict] = {}  # query -> its last progress

    def start(self) -> None:
        from infra.stack import settings_env

        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pipelines.analytics", "--namespace", self.namespace],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=settings_env(self.settings),
                start_new_session=True,
            )

    def _progress(self) -> list[dict]:
        """The progress lines written since the last call (whole lines only)."""
        with self._lock:
            return self._read_progress()

    def _read_progress(self) -> list[dict]:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"the analytics exited with {self.proc.returncode}; see {self.log_path}")
        try:
            with self.progress_path.open("rb") as f:
                f.seek(self._read_to)
                chunk = f.read()
        except FileNotFoundError:
            return []
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._read_to += len(complete)
        out = [json.loads(line) for line in complete.splitlines() if line.strip()]
        for p in out:
            self._last[p["name"]] = p
            if self.measuring_since is not None:
                self.batches[(p["name"], p["batchId"])] = {
                    "t_s": self._t(),
                    "query": p["name"],
                    "batch_id": p["batchId"],
                    "ms": p["durationMs"].get("triggerExecution"),
                    "rows": p.get("numInputRows", 0),
                    "duration_ms": p["durationMs"],  # Spark's breakdown: where a batch's time went
                }
        return out

    def wait_read(self, ends: dict[int, int], timeout_s: float) -> bool:
        """Until every query has a finished micro-batch that read up to ``ends``: before the load
        (the bootstrap: the load is then measured beside queries in their steady state, not their
        start-up) and after it (the analytics' own lag behind the log's end).

        The ``events`` query reads the log (Kafka offsets in its progress); an output query has
        read up to ``ends`` once a micro-batch of it started after the ``events`` batch that got
        there had committed its rows to the table the outputs read.
        """
        from datetime import datetime

        from pipelines.analytics.runner import EVENTS, QUERIES

        topic, parse = self.settings.events_topic, f"analytics_{EVENTS}"
        parsed_at: float | None = None  # when the events batch that reached ``ends`` finished
        covered: set[str] = set()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for p in self._progress():
                started = datetime.fromisoformat(p["timestamp"]).timestamp()
                if p["name"] == parse and parsed_at is None:
                    end = p["sources"][0].get("endOffset")
                    got = (json.loads(end) if isinstance(end, str) else end or {}).get(topic, {})
                    if all(int(got.get(str(part), 0)) >= o for part, o in ends.items()):
                        parsed_at = started + p["durationMs"]["triggerExecution"] / 1000
                elif parsed_at is not None and started >= parsed_at:
                    covered.add(p["name"])
            if len(covered) == len(QUERIES):
                return True
            time.sleep(2)
        return False

    def measure(self) -> None:
        """From now on: sample every 5 s, inject the patterns every 15 s."""
        self._progress()  # the bootstrap's batches are not the run's
        self.measuring_since = time.monotonic()
        self.threads = [threading.Thread(target=f, daemon=True) for f in (self._sample, self._inject)]
        for t in self.threads:
            t.start()

    def _t(self) -> float:
        return round(time.monotonic() - (self.measuring_since or time.monotonic()), 1)

    def _sample(self) -> None:
        while not self.done.wait(SAMPLE_S):
            self._progress()
            row = {"t_s": self._t(), "state_rows": 0, "state_bytes": 0, "state_sst_bytes": 0}
            for last in self._last.values():
                for op in last.get("stateOperators", []):
                    row["state_rows"] += op.get("numRowsTotal", 0)
                    row["state_bytes"] += op.get("memoryUsedBytes", 0)
                    row["state_sst_bytes"] += int(op.get("customMetrics", {}).get("rocksdbSstFileSize", 0))
            self.samples.append(row)

    def _inject(self) -> None:
        from app_sim.generator import PATTERNS, inject

        while not self.done.is_set():
            self.injected += inject(
                list(PATTERNS),
                topic=self.settings.events_topic,
                bootstrap=self.settings,
                user=PATTERN_USER,
                settings=self.settings,
            )
            self.done.wait(15)

    def stop(self) -> None:
        self.done.set()
        for t in self.threads:
            t.join(timeout=60)
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def alert_latencies_ms(self) -> list[int]:
        """Record time on the alerts topic - receive time of the newest event that fired it."""

        consumer = clients.kafka_consumer(
            self.settings, f"bench-alerts-{self.namespace}", {"auto.offset.reset": "earliest"}
        )
        consumer.subscribe([self.settings.alerts_topic])
        out, idle = [], 0
        try:
            while idle < 5:
                msg = consumer.poll(1.0)
                if msg is None or msg.error() is not None:
                    idle += 1
                    continue
                out.append(msg.timestamp()[1] - json.loads(msg.value())["last_received_time"])
        finally:
            consumer.close()
        return out

    def window_latencies_ms(self, name: str = "activity_per_minute") -> list[int]:
        """Per window row: the Delta commit that added it - its window end."""
        table = self.paths.table(name)
        out = []
        read = self.spark.read.format("delta")
        for commit in sorted(Path(table).glob("_delta_log/*.json")):
            actions = [json.loads(line) for line in commit.read_text().splitlines()]
            committed = next((a["commitInfo"].get("timestamp") for a in actions if "commitInfo" in a), None)
            version = int(commit.stem)
            if committed is None or version == 0 or not any("add" in a for a in actions):
                continue
            added = (
                read.option("versionAsOf", version)
                .load(table)
                .exceptAll(read.option("versionAsOf", version - 1).load(table))
            )
            out += [
                committed - int(r["window_end"].replace(tzinfo=UTC).timestamp() * 1000)
                for r in added.select("window_end").collect()
            ]
        return out


def speed_layer_phase(
    settings: Settings,
    r: redis.Redis,
    log_path: Path,
    beside: _AnalyticsBeside | None = None,
    *,
    rate: int,
    seconds: int,
    burst_events: int = 0,
) -> dict:
    """One phase of a speed layer of its own: bootstrap, reset the histogram, ``rate`` events/s
    for ``seconds``; its freshness, lag and applied rate. With ``burst_events``, then that many
    events as fast as the generator sends them: the rate it drains a backlog at (its throughput).
    Also the ``cluster_scaling`` section's (``stories/bench_cluster.py``) measurement."""
    from app_sim.generator import produce
    from infra.stack import end_offsets
    from pipelines.verify import keyed_freshness

    topic, ns = settings.events_topic, settings.views_namespace
    sl = SpeedLayerProcess(settings, topic, ns, log_path, archive=False).start()
    try:
        if beside is not None:
            beside.start()
        boot = _generator(GRAPH_SEED, bootstrap=True)
        produce(boot.bootstrap_events(), boot, topic=topic, bootstrap=settings, progress=False)
        wait_applied(r, settings, end_offsets(settings, topic), 600, log_path, "apply the bootstrap")
        warm = None
        if beside is not None:
            warm = beside.wait_read(end_offsets(settings, topic), WARM_UP_S)
        reset_freshness(r, ns, settings.serving_layout, end_offsets(settings, topic))
        if beside is not None:
            beside.measure()
        t0 = time.perf_counter()
        n = rate * seconds
        produce(
            n,
            _generator(GRAPH_SEED + 1, bootstrap=False),
            topic=topic,
            bootstrap=settings,
            rate=rate,
            progress=False,
        )
        sent_s = time.perf_counter() - t0
        ends = end_offsets(settings, topic)
        caught_up = wait_fences(r, ns, ends, CATCH_UP_S, settings.serving_layout) is not None
        behind_s = time.perf_counter() - t0 - sent_s
        fresh = keyed_freshness(r, ns, settings.serving_layout, ends)
        if beside is not None:  # the analytics' own lag: until every query has read the load
            beside.caught_up = beside.wait_read(ends, CATCH_UP_S)
            beside.caught_up_after_s = round(time.perf_counter() - t0 - sent_s, 1)
        burst = _burst(settings, r, burst_events) if burst_events and caught_up else {}
    finally:
        sl.stop()
        if beside is not None:
            beside.stop()
    return {
        "events": n,
        "achieved_events_per_s": round(n / sent_s),
        "caught_up": caught_up,
        # after the last event was sent, until the keyed state covered the log's end: a lag the
        # histogram's cap does not hide
        "caught_up_after_s": round(behind_s, 1) if caught_up else None,
        "applied_events_per_s": round(n / (sent_s + behind_s)) if caught_up else None,
        **{f"freshness_{k}": v for k, v in fresh.items() if k != "events"},
        "freshness_p99_at_cap": bool(fresh["p99_ms"] and fresh["p99_ms"] > FRESHNESS_CAP_MS),
        **({} if warm is None else {"analytics_warmed_up": warm}),
        **burst,
    }


def _burst(settings: Settings, r: redis.Redis, n: int) -> dict:
    """``n`` events sent as fast as the generator goes, from a caught-up speed layer: the events/s
    from the first send until the keyed state covers them all (the sending overlaps the applying,
    so this is the slower of the two: the speed layer's, when the generator is faster)."""
    from app_sim.generator import produce
    from infra.stack import end_offsets

    topic, ns = settings.events_topic, settings.views_namespace
    cpu0 = redis_cpu_s(r)
    t0 = time.perf_counter()
    sent = produce(
        n,
        _generator(GRAPH_SEED + 2, bootstrap=False),
        topic=topic,
        bootstrap=settings,
        progress=False,
    )
    sent_s = time.perf_counter() - t0
    done = wait_fences(r, ns, end_offsets(settings, topic), CATCH_UP_S, settings.serving_layout) is not None
    total_s = time.perf_counter() - t0
    cpu = redis_cpu_s(r) - cpu0
    return {
        "burst_events": n,
        "burst_sent_events_per_s": sent.events_per_s,
        "burst_applied": done,
        "burst_applied_events_per_s": round(n / total_s) if done else None,
        "burst_applied_after_send_s": round(total_s - sent_s, 1) if done else None,
        # Redis's own CPU over the drain (INFO cpu): a share near 1.0 means its one core is the limit
        "burst_redis_cpu_share": round(cpu / total_s, 2),
        "burst_redis_cpu_us_per_event": round(cpu * 1e6 / n),
    }


def plot_curves(samples: list[dict], batches: list[dict], seconds: int) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 3.6), dpi=100)
    try:
        ts = [s["t_s"] for s in samples]
        a.plot(ts, [s["state_rows"] for s in samples], color="#4c78a8", label="state rows")
        a.set_xlabel("seconds into the run")
        a.set_ylabel("state rows (all queries)")
        a2 = a.twinx()
        a2.plot(ts, [s["state_sst_bytes"] / 2**20 for s in samples], color="#f58518", label="RocksDB SST MiB")
        a2.set_ylabel("RocksDB SST files, MiB")
        a.set_title("state size")
        a.legend(loc="upper left", fontsize=8)
        a2.legend(loc="lower right", fontsize=8)
        for name in sorted({x["query"] for x in batches}):
            pts = [x for x in batches if x["query"] == name and x["ms"] is not None]
            b.plot([x["t_s"] for x in pts], [x["ms"] / 1000 for x in pts], ".", label=name[10:], ms=4)
        b.set_xlabel("seconds into the run")
        b.set_ylabel("micro-batch duration, s")
        b.set_title("micro-batch duration, per query")
        b.legend(fontsize=6, ncol=2)
        fig.suptitle(
            f"the analytics beside the keyed speed layer: {seconds} s of load, sampled until it caught up",
            fontsize=10,
        )
        return png_bytes(fig)
    finally:
        plt.close(fig)


def _thirds(values: list[float]) -> tuple[float | None, float | None]:
    k = max(len(values) // 3, 1)
    return pct(values[:k], 0.5), pct(values[-k:], 0.5)


def _reset_redis(r: redis.Redis, ns: str, timeout_s: float = 600) -> None:
    """Drop the first phase's namespace and rewrite the AOF, so the second phase starts from the
    same Redis as the first (a phase's own keys make the next phase's AOF rewrites heavier)."""
    from contract.functions import drop_namespace

    drop_namespace(r, ns)
    deadline = time.monotonic() + timeout_s
    while r.info("persistence")["aof_rewrite_in_progress"] and time.monotonic() < deadline:
        time.sleep(1)
    r.bgrewriteaof()
    time.sleep(1)
    while (
        r.info("persistence")["aof_rewrite_in_progress"] or r.info("persistence")["aof_rewrite_scheduled"]
    ) and time.monotonic() < deadline:
        time.sleep(1)


@section("analytics")
def analytics_section(ctx: BenchContext) -> dict:
    from contract.functions import drop_namespace
    from pipelines.spark import build_spark

    var = Path(tempfile.mkdtemp(prefix="bench-analytics-"))
    base = dataclasses.replace(ctx.settings, var_dir=var, analytics_lateness_s=ANALYTICS_LATENESS_S)
    r = keyed_connect(base.redis_url)
    out: dict = {
        "rate_events_per_s": ctx.analytics_rate,
        "seconds_per_phase": ctx.analytics_seconds,
        "seconds_alone": ctx.analytics_first_phase_s,
        "lateness_s": ANALYTICS_LATENESS_S,
        "trigger": base.analytics_trigger_interval,
    }
    namespaces: list[str] = []
    spark = build_spark("bench-analytics", base)
    try:
        phases, analytics = _phases(ctx, base, r, spark, namespaces)
        out.update({f"{label}_{k}": v for label, p in phases.items() for k, v in p.items()})
        out.update(_ratios(ctx, phases, out["seconds_alone"]))
        out.update(_analytics_figures(analytics))
        out_dir = Path(ctx.settings.reports_dir) / "bench"
        out_dir.mkdir(parents=True, exist_ok=True)
        curves = out["curves"]
        png = plot_curves(curves["state"], curves["batches"], ctx.analytics_seconds)
        (out_dir / "analytics_curves.png").write_bytes(png)
        out["curves_png"] = str(out_dir / "analytics_curves.png")
    finally:
        spark.stop()
        for ns in namespaces:
            drop_namespace(r, ns)
        shutil.rmtree(var, ignore_errors=True)
    return out


def _phases(
    ctx: BenchContext, base: Settings, r: redis.Redis, spark, namespaces: list[str]
) -> tuple[dict[str, dict], _AnalyticsBeside]:
    """Both phases, alone then with the analytics, each on its own topics and namespace (added to
    ``namespaces`` for the cleanup); their results, and the analytics that ran beside the second."""
    phases = {}
    analytics = None
    for label in ("alone", "with_analytics"):
        ns = f"bench_an_{label}_{ctx.run_id}".lower()
        namespaces.append(ns)
        settings = dataclasses.replace(
            base,
            events_topic=ctx.topic(f"analytics_{label}"),
            views_namespace=ns,
            alerts_topic=ctx.topic(f"alerts_{label}", partitions=1),
        )
        beside = _AnalyticsBeside(spark, settings, ns) if label != "alone" else None
        print(f"bench analytics: {label}", flush=True)
        forks0 = r.info("stats")["total_forks"]
        phases[label] = speed_layer_phase(
            settings,
            r,
            Path(base.var_dir) / f"speed_layer_{label}.log",
            beside,
            rate=ctx.analytics_rate,
            seconds=ctx.analytics_seconds if beside is not None else ctx.analytics_first_phase_s,
        )
        # the speed layer's own Redis cost over the phase: its AOF rewrites (each a fork whose
        # copy-on-write grows with the dataset), and the memory it ended with
        phases[label]["redis_forks"] = r.info("stats")["total_forks"] - forks0
        phases[label]["redis_used_memory_mb"] = round(r.info("memory")["used_memory"] / 2**20)
        if beside is None:
            _reset_redis(r, ns)
        analytics = beside or analytics
    assert analytics is not None  # the second phase's
    return phases, analytics


def _ratios(ctx: BenchContext, phases: dict[str, dict], seconds_alone: int) -> dict:
    """The speed layer's freshness p99 and applied rate, with the analytics over without."""
    out: dict = {}
    p0, p1 = phases["alone"]["freshness_p99_ms"], phases["with_analytics"]["freshness_p99_ms"]
    out["freshness_p99_ratio_with_over_without"] = round(p1 / p0, 2) if p0 and p1 else None
    if seconds_alone != ctx.analytics_seconds:
        # not side by side: over a longer load the speed layer's own Redis grows (event ids
        # kept a day, the changelog untrimmed without an archiver) and its AOF rewrites with it
        out["freshness_p99_ratio_with_over_without"] = None
        out["freshness_ratio_withheld"] = "the phases ran for different times"
    capped = any(p["freshness_p99_at_cap"] for p in phases.values())
    if out["freshness_p99_ratio_with_over_without"] is not None and not capped:
        out["freshness_within_1_5x"] = out["freshness_p99_ratio_with_over_without"] <= 1.5
    # a p99 at the histogram's cap (the speed layer fell behind the rate) says nothing about
    # the ratio: then the lag after the load and the rate applied are the comparison
    a0, a1 = phases["alone"]["applied_events_per_s"], phases["with_analytics"]["applied_events_per_s"]
    out["applied_rate_ratio_with_over_without"] = round(a1 / a0, 2) if a0 and a1 else None
    return out


def _analytics_figures(analytics: _AnalyticsBeside) -> dict:
    """The analytics' own figures over the second phase: their lag, where a micro-batch's time
    goes, alert and window latencies, and the state and batch duration curves."""
    alerts, windows = analytics.alert_latencies_ms(), analytics.window_latencies_ms()
    batches = sorted(analytics.batches.values(), key=lambda x: x["t_s"])
    batches = [x for x in batches if x["t_s"] >= 0]  # the measured run only
    samples = [s for s in analytics.samples if s["t_s"] > 0]
    rows0, rows1 = _thirds([s["state_rows"] for s in samples])
    ms0, ms1 = _thirds([x["ms"] for x in batches if x["ms"] is not None])
    parts = sorted({k for x in batches for k in x["duration_ms"]})
    out = {
        "analytics_caught_up": analytics.caught_up,
        # after the load, until every query had read it: the analytics' own lag
        "analytics_caught_up_after_s": analytics.caught_up_after_s,
        # where a micro-batch's time goes (Spark's durationMs), median over every query
        "batch_ms_median_by_part": {
            k: pct([x["duration_ms"][k] for x in batches if k in x["duration_ms"]], 0.5) for k in parts
        },
        "patterns_injected_events": analytics.injected,
        "alerts": len(alerts),
        "alert_latency_p50_ms": pct(alerts, 0.5),
        "alert_latency_p99_ms": pct(alerts, 0.99),
        "windows_written": len(windows),
        "window_end_to_visible_p50_ms": pct(windows, 0.5),
        "window_end_to_visible_p99_ms": pct(windows, 0.99),
        "state_rows_median_first_third": rows0,
        "state_rows_median_last_third": rows1,
        "batch_ms_median_first_third": ms0,
        "batch_ms_median_last_third": ms1,
        "curves": {"state": samples, "batches": batches},
    }
    if ms0 and ms1:
        out["batch_ms_last_over_first_third"] = round(ms1 / ms0, 2)
    return out
