"""``make bench``: side-by-side benchmarks, each a ratio measured in one run.

Absolute rates on a shared 2-core machine are noise; a ratio against a reference measured in the
same run, on the same broker, is not. Each section is a function ``(BenchContext) -> dict``
registered with ``@section(name)``; results are merged into ``var/reports/bench/latest.json``
(other sections' earlier results are kept), a timestamped copy is written next to it, and a short
table is printed.

``python -m infra.bench [--only ingest] [--events N]``. Uses the running local stack if Kafka
answers on the configured port, else starts one (``infra.stack``) and stops it afterwards.

Sections, in order: ``ingest`` (the generator vs Kafka's own ``ProducerPerformance``);
``serving`` (the API's reads/s and p99 under Locust over a pre-populated serving store, writes/s
too); ``replay`` (full recompute vs a bare read and vs the parse step alone, 1x and 10x log);
``stream`` (catch-up vs a ``noop`` sink, the parse step's floor at the target's batch size, the
Delta commits' floor of a one-row batch, freshness at a fixed rate with each phase's share);
``scaling`` (one micro-batch on 1x and 10x state); ``analytics`` (the speed layer's freshness
with and without the analytics beside it, their own latency, state size and batch duration). The
README says how to read each figure.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from infra.settings import Settings, get_settings

SECTIONS: dict[str, Callable[[BenchContext], dict]] = {}


def section(name: str):
    """Register a benchmark section (runs in registration order)."""

    def register(fn):
        SECTIONS[name] = fn
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
    replay_events: int = 200_000  # 10x; 1x is a tenth
    stream_events: int = 100_000
    freshness_rate: int = 500
    freshness_seconds: int = 60
    target_rate: int = 20_000  # the issue's target: sustained events/s at freshness p99 <= 5 s
    freshness_p99_target_ms: int = 5_000
    floor_batches: int = 8  # the first (cold JVM, cold codegen) is left out of the median
    ryw_writes: int = 50  # keyed: read-your-write samples, idle and under load
    ryw_load_rate: int = 5_000
    keyed_rates: tuple[int, ...] = (1_000, 5_000, 10_000)
    keyed_seconds: int = 120
    scaling_state_events: int = 20_000
    scaling_probe_events: int = 5_000
    batch_events: int = 1_000_000  # the batch layer's 10x log; 1x and 3x are a tenth and 3 tenths

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


# --- ingest -------------------------------------------------------------------------------------------

PERF_TOOL = "org.apache.kafka.tools.ProducerPerformance"
_PERF_LINE = re.compile(
    r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, "
    r"([\d.]+) ms max latency(?:, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th)?"
)


def _java_producer_props(bootstrap: str) -> list[str]:
    """The generator's producer settings, in Java client names (same durability, same batching)."""
    from app_sim.generator import producer_config

    cfg = producer_config(bootstrap)
    return [
        f"bootstrap.servers={bootstrap}",
        f"acks={cfg['acks']}",
        f"enable.idempotence={str(cfg['enable.idempotence']).lower()}",
        f"compression.type={cfg['compression.type']}",
        f"linger.ms={cfg['linger.ms']}",
        f"batch.size={cfg['batch.size']}",
        "buffer.memory=268435456",
    ]


def producer_performance(
    settings: Settings, topic: str, records: int, payload_file: Path, timeout_s: float = 600
) -> dict:
    """Run Kafka's ``kafka-producer-perf-test`` (``ProducerPerformance``) and parse its summary."""
    from infra.jars import kafka_classpath, require_java

    cmd = [
        require_java(),
        "-Xmx1g",
        "-cp",
        kafka_classpath(settings),
        PERF_TOOL,
        "--topic",
        topic,
        "--num-records",
        str(records),
        "--throughput",
        "-1",
        "--payload-file",
        str(payload_file),
        "--producer-props",
        *_java_producer_props(settings.kafka_bootstrap),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    lines = [m for m in _PERF_LINE.finditer(proc.stdout)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{PERF_TOOL} failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-2000:]}")
    m = lines[-1]  # the final summary line
    out = {
        "records": int(m.group(1)),
        "events_per_s": float(m.group(2)),
        "mb_per_s": float(m.group(3)),
        "avg_latency_ms": float(m.group(4)),
        "max_latency_ms": float(m.group(5)),
    }
    if m.group(8):
        out["p99_latency_ms"] = float(m.group(8))
    return out


@section("ingest")
def ingest(ctx: BenchContext) -> dict:
    """Generator events/s into the broker vs ProducerPerformance with the same records and settings."""
    import orjson

    from app_sim.generator import GeneratorConfig, generate, produce

    cfg = GeneratorConfig(users=2000, seed=42, invalid_share=0.001, duplicate_share=0.001)
    n = ctx.events

    # Pure generation + serialisation (no broker): the generator's own ceiling.
    t = time.perf_counter()
    n_gen = min(n, 300_000)
    sample: list[bytes] = []
    for i, (_k, v, _inj) in enumerate(generate(n_gen, cfg)):
        raw = orjson.dumps(v) if type(v) is dict else v
        if i % 29 == 0 and len(sample) < 10_000:
            sample.append(raw)
    generate_only = n_gen / (time.perf_counter() - t)

    summary = produce(
        n, cfg, topic=ctx.topic("ingest-generator"), bootstrap=ctx.settings.kafka_bootstrap, progress=False
    )

    # ProducerPerformance sends real generator records (same sizes, same compressibility), but
    # without keys: it never does less work than the generator per record.
    with tempfile.NamedTemporaryFile("wb", suffix=".jsonl", delete=False) as f:
        f.write(b"\n".join(r.replace(b"\n", b" ") for r in sample if b"\n" not in r))
        payload_file = Path(f.name)
    try:
        perf = producer_performance(ctx.settings, ctx.topic("ingest-perf"), n, payload_file)
    finally:
        payload_file.unlink(missing_ok=True)
    return {
        "events": n,
        "partitions": ctx.settings.events_partitions,
        "mean_record_bytes": summary.mean_record_bytes,
        "producer": "acks=all, idempotent, lz4, linger.ms=20, batch.size=1MB",
        "generator_only_events_per_s": round(generate_only),
        "generator_events_per_s": summary.events_per_s,
        "generator_delivery_failures": summary.delivery_failures,
        "producer_perf_events_per_s": perf["events_per_s"],
        "producer_perf": perf,
        "ratio_generator_vs_producer_perf": round(summary.events_per_s / perf["events_per_s"], 3),
    }


# --- serving ------------------------------------------------------------------------------------------


def _populate_serving_store(settings: Settings, namespace: str, users: int, seed: int) -> list[int]:
    """A serving store as the speed layer leaves it, written directly (key layout of ServingStore).

    Users follow others by the generator's heavy-tailed graph (``app_sim.graph``); each home
    timeline holds the latest 50 posts of the user and their followees, every user has a status,
    a few inbox messages and an unread count. Returns the user ids.
    """
    import numpy as np
    import orjson

    from app_sim import graph
    from pipelines.serving import ServingStore, _pid, connect

    rng = np.random.default_rng(seed)
    edges = graph.follower_graph(users, 20.0, rng)
    store = ServingStore(connect(settings.redis_url), namespace)
    k, r = store.k, store.r
    posts_per_user = 10
    post_ids = {u: [u * 1000 + i for i in range(posts_per_user)] for u in range(1, users + 1)}
    following: dict[int, list[int]] = {u: [] for u in range(1, users + 1)}
    for a, b in edges.tolist():
        following[a].append(b)
    pipe = r.pipeline(transaction=False)
    for u in range(1, users + 1):
        pipe.hset(k("users"), u, orjson.dumps({"handle": f"u{u}", "display_name": f"User {u}"}))
        pipe.hset(k("status"), u, orjson.dumps({"text": f"status of {u}", "event_time": 1}))
        for i, pid in enumerate(post_ids[u]):
            body = {"post_id": pid, "author_id": u, "text": "x" * int(rng.integers(20, 200)), "event_time": i}
            pipe.set(k("p", pid), orjson.dumps(body))
            pipe.zadd(k("posts", u), {_pid(pid): i})
        authors = [u, *following[u]]
        candidates = [(i * users + a, post_ids[a][i]) for a in authors for i in range(posts_per_user)]
        top = sorted(candidates, reverse=True)[:50]
        pipe.zadd(k("tl", u), {_pid(pid): score for score, pid in top})
        for f in following[u]:
            pipe.sadd(k("following", u), f)
        for j in range(3):
            mid = 10_000_000 + u * 10 + j
            pipe.zadd(k("inbox", u), {_pid(mid): j})
            msg = {"message_id": mid, "sender_id": 1, "text": "hello", "event_time": j, "read": j == 0}
            pipe.hset(k("msgs", u), mid, orjson.dumps(msg))
        pipe.hset(k("unread"), u, 2)
        if u % 200 == 0:
            pipe.execute()
    pipe.hset(k("fence"), mapping={"0": 0})
    pipe.execute()
    return list(range(1, users + 1))


@section("serving")
def serving(ctx: BenchContext) -> dict:
    """Reads/s and p99 of the API under Locust (2 workers + Locust on this machine), writes too."""
    import dataclasses
    import socket

    import orjson

    from app_sim.auth import TokenSigner, load_secret
    from app_sim.load import run_locust
    from infra.stack import ApiServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    namespace = f"bench-serving-{ctx.run_id}".lower()
    settings = dataclasses.replace(
        ctx.settings,
        events_topic=ctx.topic("serving"),
        api_port=port,
        views_namespace=namespace,
        var_dir=Path(ctx.settings.var_dir) / "bench" / "serving",
    )
    users = _populate_serving_store(settings, namespace, users=2000, seed=11)
    signer = TokenSigner(load_secret(settings))
    out_dir = Path(ctx.settings.reports_dir) / "bench" / "serving"
    out_dir.mkdir(parents=True, exist_ok=True)
    users_file = out_dir / "users.json"
    users_file.write_text(orjson.dumps([[u, signer.issue(u)] for u in users]).decode())
    api = ApiServer(settings)
    api.start()
    try:
        summary = run_locust(
            f"http://127.0.0.1:{port}",
            out_dir,
            users=ctx.serving_users,
            spawn_rate=ctx.serving_users,
            run_time_s=ctx.serving_seconds,
            extra_env={"LOAD_USERS_FILE": str(users_file)},
        )
    finally:
        api.stop()
        _drop_namespace(settings, namespace)
    reads, writes = summary["reads"], summary["writes"]
    return {
        "api_workers": settings.api_workers,
        "locust_users": ctx.serving_users,
        "seconds": summary["seconds"],
        "store_users": len(users),
        "reads_per_s": reads["per_s"],
        "reads_p50_ms": reads["p50_ms"],
        "reads_p99_ms": reads["p99_ms"],
        "writes_per_s": writes["per_s"],
        "writes_p50_ms": writes["p50_ms"],
        "writes_p99_ms": writes["p99_ms"],
        "failures": summary["failures"],
        "target": "reads >= 1500/s with p99 <= 50 ms",
        "target_met": reads["per_s"] >= 1500 and (reads["p99_ms"] or 1e9) <= 50,
        "endpoints": summary["endpoints"],
        "report": str(out_dir / "report.html"),
    }


def _drop_namespace(settings: Settings, namespace: str) -> None:
    import redis

    from pipelines.speed.functions import drop_namespace

    drop_namespace(redis.Redis.from_url(settings.redis_url), namespace)


# --- the speed layer, the replay, scaling (issue 3) -----------------------------------------------------


def _fill(ctx: BenchContext, purpose: str, events: int, users: int, **gen) -> tuple[str, object]:
    from app_sim.generator import GeneratorConfig, produce

    topic = ctx.topic(purpose)
    cfg = GeneratorConfig(users=users, seed=3, **gen)
    summary = produce(events, cfg, topic=topic, bootstrap=ctx.settings.kafka_bootstrap, progress=False)
    return topic, summary


def _spark(ctx: BenchContext, **conf: str):
    from pipelines.spark import build_spark

    return build_spark("bench", ctx.settings, extra_conf=conf)


def _warm_median(seconds: list[float]) -> tuple[int, float]:
    """(batches counted, median seconds), leaving out the first batch: cold JVM, cold codegen,
    every table's first snapshot."""
    import statistics

    warm = seconds[1:]
    return len(warm), round(statistics.median(warm), 2)


def _sql_executions(spark, details: bool = True) -> list[dict]:
    """The session's SQL executions with their plan nodes' metrics, from the Spark UI's REST API.

    Waits until the UI has taken in every execution the driver has started (its listener bus is
    asynchronous).
    """
    import urllib.request

    sc = spark.sparkContext
    if not sc.uiWebUrl:
        raise RuntimeError("the scaling section reads plan metrics from the Spark UI: set spark.ui.enabled")
    port = sc.uiWebUrl.rsplit(":", 1)[1]
    url = (
        f"http://127.0.0.1:{port}/api/v1/applications/{sc.applicationId}/sql"
        f"?details={str(details).lower()}&planDescription=false&offset=0&length=1000000"
    )
    deadline = time.monotonic() + 60
    while True:
        with urllib.request.urlopen(url, timeout=30) as reply:
            executions = json.load(reply)
        if all(e["status"] != "RUNNING" for e in executions) or time.monotonic() > deadline:
            return executions
        time.sleep(0.5)


def _rows_read(executions: list[dict], after_id: int) -> int:
    """Rows read from table files (Delta's parquet scans) by the executions after ``after_id``."""
    rows = 0
    for e in executions:
        if e["id"] <= after_id:
            continue
        for node in e.get("nodes", []):
            if node["nodeName"].startswith("Scan parquet"):
                for m in node.get("metrics", []):
                    if m["name"] == "number of output rows":
                        rows += int(m["value"].replace(",", ""))
    return rows


@section("replay")
def replay_section(ctx: BenchContext) -> dict:
    """Full recompute from the log vs a bare batch read of the same offsets; 1x and 10x log size.

    Between the two, the parse step alone (read + contract checks, no fold): the ceiling any
    replay built on the contract's validation can reach on this machine.
    """
    from pipelines.parse import parse_records
    from pipelines.replay import read_log, recompute
    from pipelines.speed_layer import view_config

    spark = _spark(ctx)
    out: dict = {}
    for label, n in (("1x", ctx.replay_events // 10), ("10x", ctx.replay_events)):
        topic, _ = _fill(ctx, f"replay{label}", n, users=max(200, n // 100), mean_followers=30)
        t = time.perf_counter()
        read_log(spark, ctx.settings, topic, None).write.format("noop").mode("overwrite").save()
        bare = time.perf_counter() - t
        # the mandated first step alone (contract checks, split into events and quarantine):
        # what any fold, however fast, would have to run before it
        t = time.perf_counter()
        events, quarantine = parse_records(read_log(spark, ctx.settings, topic, None))
        for df in (events, quarantine):
            df.write.format("noop").mode("overwrite").save()
        parse_only = time.perf_counter() - t
        t = time.perf_counter()
        result = recompute(spark, ctx.settings, topic, None, view_config(ctx.settings))
        rows = sum(df.count() for df in result.tables().values())
        full = time.perf_counter() - t
        out[f"events_{label}"] = n
        out[f"bare_read_events_per_s_{label}"] = round(n / bare)
        out[f"parse_only_events_per_s_{label}"] = round(n / parse_only)
        out[f"replay_events_per_s_{label}"] = round(n / full)
        out[f"replay_seconds_{label}"] = round(full, 1)
        out[f"replay_vs_bare_ratio_{label}"] = round(bare / full, 3)
        out[f"replay_vs_parse_only_ratio_{label}"] = round(parse_only / full, 3)
        out[f"rows_{label}"] = rows
    out["replay_time_ratio_10x_over_1x"] = round(out["replay_seconds_10x"] / out["replay_seconds_1x"], 2)
    spark.stop()
    return out


def _stream_parse_floor(ctx: BenchContext, spark, batch_events: int) -> dict:
    """Kafka -> the parse step -> ``noop``, as a stream of ``batch_events``-record micro-batches.

    An event waits for the batch in progress, then rides the next one, so freshness p99 <= 5 s
    at the target rate needs micro-batches of ``target_rate * 2.5 s`` records that finish within
    2.5 s. This measures the part of such a batch no fold design can avoid: reading it and
    checking it against the contract (nothing is written anywhere).
    """
    import tempfile

    from pipelines.parse import parse_records
    from pipelines.speed.stream import kafka_stream as kafka_source

    topic, _ = _fill(ctx, "floor", batch_events * ctx.floor_batches, users=2_000, mean_followers=30)

    def body(records, _batch_id):
        events, quarantine = parse_records(records)
        for df in (events, quarantine):
            df.write.format("noop").mode("overwrite").save()

    with tempfile.TemporaryDirectory(prefix="bench-floor-") as chk:
        query = (
            kafka_source(spark, ctx.settings, topic, max_offsets=batch_events)
            .writeStream.foreachBatch(body)
            .option("checkpointLocation", chk)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        seconds = [
            p["durationMs"]["triggerExecution"] / 1000 for p in query.recentProgress if p["numInputRows"]
        ]
    batches, median = _warm_median(seconds)
    return {
        "parse_floor_batch_events": batch_events,
        "parse_floor_micro_batches": batches,
        "parse_floor_micro_batch_seconds_median": median,
        "parse_floor_events_per_s": round(batch_events / median),
    }


def _commit_floor(ctx: BenchContext, spark) -> dict:
    """The Delta side of a micro-batch with next to nothing in it, as the speed layer writes it.

    One row per table through :meth:`pipelines.lake.Lake.write_batch`: the two appends, the seven
    fenced MERGEs and the ``batches`` row, into a scratch namespace that is removed afterwards.
    No fold, no data volume: whatever a batch computes, it pays at least this before the next
    batch can read its state, so this too must fit the batch budget for the freshness target.
    """
    import shutil

    from pipelines.lake import Lake
    from pipelines.views import BatchOutput, empty_table

    lake = Lake(spark, ctx.settings.lake_dir, f"bench_commit_{ctx.run_id}".lower())
    lake.ensure_tables()

    def one_row(table: str, batch: int):
        schema = empty_table(spark, table).schema
        value = {"bigint": batch, "int": 0, "string": "bench", "boolean": False}
        row = {f.name: value[f.dataType.simpleString()] for f in schema}
        if "received_date" in row:
            row["received_date"] = "2026-01-01"
        return spark.createDataFrame([row], schema)

    seconds = []
    try:
        for b in range(ctx.floor_batches):
            out = BatchOutput(
                bronze=one_row("events_bronze", b),
                rejected=empty_table(spark, "quarantine"),
                users=one_row("users", b),
                follows_upserts=one_row("follows", b),
                follows_deletes=empty_table(spark, "follows"),
                posts=one_row("posts", b),
                timeline_inserts=one_row("home_timeline", b),
                timeline_deletes=empty_table(spark, "home_timeline"),
                inbox=one_row("inbox", b),
                unread_counts=one_row("unread_counts", b),
                user_status=one_row("user_status", b),
                celebrities=None,
            )
            meta = {
                **{k: 1 for k in ("events_read", "applied", "quarantined")},
                **{k: None for k in ("min_received", "max_received", "visible_at")},
                "end_offsets": {"0": b + 1},
                "duplicates": 0,
                "received_hist": "{}",
            }
            t = time.perf_counter()
            lake.write_batch(b, out, one_row("quarantine", b), meta)
            seconds.append(time.perf_counter() - t)
    finally:
        shutil.rmtree(lake.root, ignore_errors=True)
    batches, median = _warm_median(seconds)
    return {"commit_floor_micro_batches": batches, "commit_floor_seconds_median": median}


@section("stream")
def stream_section(ctx: BenchContext) -> dict:
    """Speed-layer catch-up throughput vs Spark reading the same topic into a noop sink; freshness."""
    import shutil
    import tempfile

    from pipelines.lake import Lake
    from pipelines.speed.stream import kafka_stream as kafka_source
    from pipelines.speed_layer import run as run_speed_layer
    from pipelines.verify import freshness

    n = ctx.stream_events
    topic, _ = _fill(ctx, "stream", n, users=max(200, n // 100), mean_followers=30)
    spark = _spark(ctx)
    budget_s = ctx.freshness_p99_target_ms / 1000 / 2  # see _stream_parse_floor
    floor = _stream_parse_floor(ctx, spark, int(ctx.target_rate * budget_s))
    commit = _commit_floor(ctx, spark)
    chk = tempfile.mkdtemp(prefix="bench-noop-")
    t = time.perf_counter()
    (
        kafka_source(spark, ctx.settings, topic)
        .writeStream.format("noop")
        .option("checkpointLocation", chk)
        .trigger(availableNow=True)
        .start()
        .awaitTermination()
    )
    noop = time.perf_counter() - t
    shutil.rmtree(chk, ignore_errors=True)
    ns = f"bench_stream_{ctx.run_id}".lower()
    t = time.perf_counter()
    run_speed_layer(ctx.settings, namespace=ns, topic=topic, available_now=True)
    speed = time.perf_counter() - t
    lake = Lake(spark, ctx.settings.lake_dir, ns)
    batches = lake.read("batches").orderBy("batch_id").collect()
    durations = [
        (b2["committed_at"] - b1["committed_at"]) / 1000 for b1, b2 in zip(batches, batches[1:], strict=False)
    ]
    out = {
        "events": n,
        "noop_events_per_s": round(n / noop),
        "speed_layer_events_per_s": round(n / speed),
        "speed_layer_vs_noop_ratio": round(noop / speed, 4),
        "micro_batches": len(batches),
        "micro_batch_seconds_median": round(sorted(durations)[len(durations) // 2], 1) if durations else None,
        "target_events_per_s": ctx.target_rate,
        **floor,
        # the parse step alone must fit the batch budget at the target rate, before any fold
        "parse_floor_fits_target_budget": floor["parse_floor_micro_batch_seconds_median"] <= budget_s,
        **commit,
        # so must the batch's Delta commits, whatever the batch holds
        "commit_floor_fits_target_budget": commit["commit_floor_seconds_median"] <= budget_s,
    }
    # Freshness at a fixed moderate rate: real server clock, the stream running continuously.
    rate, seconds = ctx.freshness_rate, ctx.freshness_seconds
    ftopic = ctx.topic("freshness")
    fns = f"bench_fresh_{ctx.run_id}".lower()
    import threading

    from app_sim.generator import GeneratorConfig, produce

    stream = threading.Thread(
        target=run_speed_layer,
        kwargs={"settings": ctx.settings, "namespace": fns, "topic": ftopic},
        daemon=True,
    )
    stream.start()
    time.sleep(20)  # the query is up and has done its first (empty) batches
    produce(
        int(rate * seconds),
        GeneratorConfig(users=500, seed=9, mean_followers=20, realtime=True),
        topic=ftopic,
        bootstrap=ctx.settings.kafka_bootstrap,
        rate=rate,
        progress=False,
    )
    time.sleep(30)
    for q in spark.streams.active:
        # between micro-batches, as the speed layer itself stops (interrupting a batch makes the
        # stream thread die noisily in Spark's error handling)
        deadline = time.monotonic() + 120
        while q.status["isTriggerActive"] and time.monotonic() < deadline:
            time.sleep(0.2)
        q.stop()
    stream.join(timeout=120)
    flake = Lake(spark, ctx.settings.lake_dir, fns)
    last = flake.last_batch()
    fresh = freshness(flake, last.batch_id) if last else {}
    busy = [b for b in flake.read("batches").collect() if b["events_read"] and b["phases"]]
    phases = [json.loads(b["phases"]) for b in busy]
    median = {
        k: round(sorted(p.get(k, 0.0) for p in phases)[len(phases) // 2], 2)
        for k in (phases[0] if phases else {})
    }
    batch_s = sorted(sum(p.values()) for p in phases)
    met = fresh.get("p99_ms") is not None and fresh["p99_ms"] <= ctx.freshness_p99_target_ms
    out.update(
        {
            "freshness_rate_events_per_s": rate,
            "freshness_p50_ms": fresh.get("p50_ms"),
            "freshness_p99_ms": fresh.get("p99_ms"),
            "freshness_p99_target_ms": ctx.freshness_p99_target_ms,
            "freshness_target_met": met,
            # the highest rate tried at which the p99 target held; 0: not even at the one rate tried
            "max_sustainable_events_per_s_p99_5s": rate if met else 0,
            # An event waits for the batch in progress, then rides the next one up to its Redis
            # write: freshness p99 is about two batch durations, so a p99 <= 5 s needs batches
            # well under 2.5 s. Where the time of a batch goes, median over the busy batches:
            "freshness_micro_batches": len(busy),
            "freshness_micro_batch_seconds_min": round(batch_s[0], 1) if batch_s else None,
            "freshness_micro_batch_seconds_median": round(batch_s[len(batch_s) // 2], 1) if batch_s else None,
            "freshness_phase_seconds_median": median,
        }
    )
    spark.stop()
    return out


@section("scaling")
def scaling_section(ctx: BenchContext) -> dict:
    """Duration of the same-size micro-batch on top of 1x and 10x total state (must stay flat).

    Both logs come from the same generator model scaled by the number of users (a user's follows,
    posts and messages are alike at 1x and 10x), so 10x the events means 10x the follows and
    about 10x the timeline rows. The state is folded in one batch; then two probe batches of the
    same size run on top, and the second (warm JIT, warm caches) is the figure, with the rows it
    read from the Delta tables: with no full-table scan per micro-batch, those stay flat too.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from pipelines.lake import Lake
    from pipelines.replay import read_log
    from pipelines.speed_layer import BatchProcessor, view_config

    # every SQL execution of a probe batch stays in the UI, for the rows it read
    spark = _spark(ctx, **{"spark.sql.ui.retainedExecutions": "100000"})
    base = ctx.scaling_state_events
    probe = ctx.scaling_probe_events
    mean_followers = 10
    out: dict = {"probe_events": probe}
    for label, n in (("1x", base), ("10x", base * 10)):
        # registrations + follow edges stay about a quarter of the log at both sizes
        users = max(100, n // (4 * (1 + mean_followers)))
        topic, _ = _fill(ctx, f"scale{label}", n + 2 * probe, users=users, mean_followers=mean_followers)
        lake = Lake(spark, ctx.settings.lake_dir, f"bench_scale_{label}_{ctx.run_id}".lower())
        lake.ensure_tables()
        proc = BatchProcessor(spark, lake, view_config(ctx.settings))
        log = read_log(spark, ctx.settings, topic, None)
        ranked = log.withColumn("_i", F.row_number().over(Window.orderBy("offset", "partition")))
        proc(ranked.where(F.col("_i") <= n).drop("_i"), 0)
        seconds = []
        for k in (1, 2):
            lo, hi = n + (k - 1) * probe, n + k * probe
            if k == 2:  # the measured probe: its executions come after this one
                before = max((e["id"] for e in _sql_executions(spark, details=False)), default=-1)
            t = time.perf_counter()
            proc(ranked.where((F.col("_i") > lo) & (F.col("_i") <= hi)).drop("_i"), k)
            seconds.append(time.perf_counter() - t)
        # what the probe read from the Delta tables (prior state, the dedup window, MERGE targets)
        rows_read = _rows_read(_sql_executions(spark), before)
        out[f"users_{label}"] = users
        out[f"micro_batch_seconds_{label}"] = round(seconds[-1], 2)
        out[f"micro_batch_seconds_first_probe_{label}"] = round(seconds[0], 2)
        out[f"timeline_rows_{label}"] = lake.read("home_timeline").count()
        out[f"follows_rows_{label}"] = lake.read("follows").count()
        last = lake.last_batch()
        out[f"phases_{label}"] = json.loads(last.row["phases"]) if last and last.row.get("phases") else {}
        out[f"rows_read_per_micro_batch_{label}"] = rows_read
    out["state_ratio_timeline_rows"] = round(out["timeline_rows_10x"] / max(out["timeline_rows_1x"], 1), 1)
    out["micro_batch_ratio_10x_over_1x"] = round(
        out["micro_batch_seconds_10x"] / out["micro_batch_seconds_1x"], 2
    )
    out["flat_within_1_5x"] = out["micro_batch_ratio_10x_over_1x"] <= 1.5
    # No full-table scan per micro-batch: the same probe must read about as much at 10x state.
    out["rows_read_ratio_10x_over_1x"] = round(
        out["rows_read_per_micro_batch_10x"] / max(out["rows_read_per_micro_batch_1x"], 1), 2
    )
    out["reads_flat_within_1_5x"] = out["rows_read_ratio_10x_over_1x"] <= 1.5
    spark.stop()
    return out


# --- the stream analytics (issue 13) -------------------------------------------------------------------

ANALYTICS_RATE = 2_000  # events/s of the default mix, the issue's target rate
ANALYTICS_SECONDS = 60  # per phase: the speed layer alone, then with the analytics beside it
ANALYTICS_LATENESS_S = 10  # so windows close within the run (the default, 120 s, would not)


def _pct(values: list[float], q: float) -> float | None:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def _wait_covered(settings: Settings, timeout_s: float) -> None:
    """Until the speed layer's Delta views cover the topic's end (or ``timeout_s`` passed): a
    stop in the middle of its first batch would leave no ``batches`` row to measure."""
    from infra.stack import end_offsets
    from pipelines.lake import committed_position

    target = end_offsets(settings, settings.events_topic)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pos = committed_position(settings.lake_dir, settings.views_namespace)
        if pos and all(pos[1].get(p, 0) >= o for p, o in target.items()):
            return
        time.sleep(2)


def _speed_layer_freshness(ctx: BenchContext, spark, settings: Settings, during=None) -> dict:
    """Freshness p50/p99 of the speed layer, started as ``make up`` starts it, at ANALYTICS_RATE.

    ``during(settings)`` runs beside it (started after the speed layer is up, stopped at the end).
    """
    from app_sim.generator import GeneratorConfig, produce
    from infra.stack import SpeedLayer
    from pipelines.lake import Lake
    from pipelines.verify import freshness

    service = SpeedLayer(settings)
    service.start()
    stop_beside = None
    try:
        if during is not None:
            stop_beside = during(settings)
        time.sleep(15)  # the query's first (empty) batches
        produce(
            ANALYTICS_RATE * ANALYTICS_SECONDS,
            GeneratorConfig(users=2_000, seed=13, mean_followers=20, realtime=True),
            topic=settings.events_topic,
            bootstrap=settings.kafka_bootstrap,
            rate=ANALYTICS_RATE,
            progress=False,
        )
        _wait_covered(settings, timeout_s=300)
    finally:
        service.stop()
        if stop_beside is not None:
            stop_beside()
    lake = Lake(spark, settings.lake_dir, settings.views_namespace)
    last = lake.last_batch() if lake.exists() else None
    fresh = freshness(lake, last.batch_id) if last else {}
    return {"p50_ms": fresh.get("p50_ms"), "p99_ms": fresh.get("p99_ms"), "events": fresh.get("events", 0)}


@section("analytics")
def analytics_section(ctx: BenchContext) -> dict:
    """The speed layer's freshness with and without the analytics beside it; the analytics' own
    end-to-end latency, state size and micro-batch duration over the run (curves in the JSON).

    Phase 1: the speed layer alone (the ``make up`` service) at ANALYTICS_RATE events/s of the
    default mix, freshness p50/p99. Phase 2: the same on a new topic with every analytics query
    running in this process beside it (alert patterns injected every 15 s), sampled every 5 s.
    Latencies: an alert's Kafka record timestamp - the receive time of the latest event it
    carries; a window row's Delta commit time - its window end (includes the lateness).
    """
    import dataclasses
    import shutil
    import threading

    from confluent_kafka import Consumer

    from app_sim.generator import inject
    from pipelines.analytics import source
    from pipelines.analytics.config import AnalyticsConfig
    from pipelines.analytics.runner import QUERIES, Paths, start

    var = Path(tempfile.mkdtemp(prefix="bench-analytics-"))
    base = dataclasses.replace(ctx.settings, var_dir=var, analytics_lateness_s=ANALYTICS_LATENESS_S)
    spark = _spark(ctx)
    ns0, ns1 = f"bench_an0_{ctx.run_id}".lower(), f"bench_an1_{ctx.run_id}".lower()
    alone = dataclasses.replace(base, events_topic=ctx.topic("analytics0"), views_namespace=ns0)
    out: dict = {"rate_events_per_s": ANALYTICS_RATE, "seconds_per_phase": ANALYTICS_SECONDS}
    f0 = _speed_layer_freshness(ctx, spark, alone)

    beside = dataclasses.replace(
        base,
        events_topic=ctx.topic("analytics1"),
        views_namespace=ns1,
        alerts_topic=ctx.topic("alerts", partitions=1),
    )
    samples: list[dict] = []
    paths = Paths.for_namespace(beside, ns1)

    def run_analytics(settings: Settings):
        queries = start(
            spark,
            lambda: source.kafka_records(spark, settings, settings.events_topic),
            paths,
            AnalyticsConfig.from_settings(settings),
            names=QUERIES,
            namespace=ns1,
            views_root=Path(settings.lake_dir) / ns1,
            kafka=(settings.kafka_bootstrap, settings.alerts_topic),
            trigger=settings.analytics_trigger_interval,
        )
        done = threading.Event()
        t0 = time.monotonic()

        def sample():
            while not done.wait(5):
                row = {
                    "t_s": round(time.monotonic() - t0, 1),
                    "state_rows": 0,
                    "state_bytes": 0,
                    "batch_ms": {},
                }
                for q in queries:
                    p = q.lastProgress or {}
                    for op in p.get("stateOperators", []):
                        row["state_rows"] += op.get("numRowsTotal", 0)
                        row["state_bytes"] += op.get("memoryUsedBytes", 0)
                    if p:
                        row["batch_ms"][q.name] = p["durationMs"].get("triggerExecution")
                samples.append(row)
                if int(row["t_s"]) % 15 < 5:
                    inject(
                        ["burst", "follow_churn", "message_flood"],
                        topic=settings.events_topic,
                        bootstrap=settings.kafka_bootstrap,
                        user=10_000_000,
                        settings=settings,
                    )

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()

        def stop():
            done.set()
            sampler.join(timeout=60)
            for q in queries:
                q.stop()

        return stop

    f1 = _speed_layer_freshness(ctx, spark, beside, during=run_analytics)
    consumer = Consumer(
        {
            "bootstrap.servers": beside.kafka_bootstrap,
            "group.id": "bench-alerts",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([beside.alerts_topic])
    alert_ms, idle = [], 0
    while idle < 5:
        msg = consumer.poll(1.0)
        if msg is None or msg.error() is not None:
            idle += 1
            continue
        alert_ms.append(msg.timestamp()[1] - json.loads(msg.value())["last_received_time"])
    consumer.close()
    window_ms = []
    table = paths.table("activity_per_minute")
    for commit in sorted(Path(table).glob("_delta_log/*.json")):
        actions = [json.loads(line) for line in commit.read_text().splitlines()]
        committed = next((a["commitInfo"].get("timestamp") for a in actions if "commitInfo" in a), None)
        version = int(commit.stem)
        if committed is None or version == 0 or not any("add" in a for a in actions):
            continue
        read = spark.read.format("delta")
        added = (
            read.option("versionAsOf", version)
            .load(table)
            .exceptAll(read.option("versionAsOf", version - 1).load(table))
        )
        window_ms += [
            committed - int(r["window_end"].replace(tzinfo=UTC).timestamp() * 1000) for r in added.collect()
        ]
    half = len(samples) // 2
    rows = [s["state_rows"] for s in samples]
    batch = [max(s["batch_ms"].values(), default=0) for s in samples]
    out.update(
        {
            "speed_layer_freshness_p50_ms_alone": f0["p50_ms"],
            "speed_layer_freshness_p99_ms_alone": f0["p99_ms"],
            "speed_layer_freshness_p50_ms_with_analytics": f1["p50_ms"],
            "speed_layer_freshness_p99_ms_with_analytics": f1["p99_ms"],
            "freshness_p99_ratio_with_over_without": (
                round(f1["p99_ms"] / f0["p99_ms"], 2) if f0["p99_ms"] and f1["p99_ms"] else None
            ),
            "alerts": len(alert_ms),
            "alert_latency_p50_ms": _pct(alert_ms, 0.5),
            "alert_latency_p99_ms": _pct(alert_ms, 0.99),
            "window_end_to_visible_p99_ms": _pct(window_ms, 0.99),
            "state_rows_median_first_half": _pct(rows[:half], 0.5),
            "state_rows_median_second_half": _pct(rows[half:], 0.5),
            "slowest_query_batch_ms_median_first_half": _pct(batch[:half], 0.5),
            "slowest_query_batch_ms_median_second_half": _pct(batch[half:], 0.5),
            "curves": samples,
        }
    )
    if out["freshness_p99_ratio_with_over_without"] is not None:
        out["freshness_within_1_5x"] = out["freshness_p99_ratio_with_over_without"] <= 1.5
    spark.stop()
    for ns in (ns0, ns1):
        _drop_namespace(ctx.settings, ns)
    shutil.rmtree(var, ignore_errors=True)
    return out


# --- running and reporting ----------------------------------------------------------------------------


def _headline(name: str, result: dict) -> list[tuple[str, str, str]]:
    rows = []
    for key, value in result.items():
        if isinstance(value, bool):  # the targets' verdicts: met / fits / flat
            rows.append((name, key, "yes" if value else "NO"))
        elif isinstance(value, int | float):
            if isinstance(value, float):
                shown = f"{value:,.3f}" if value < 10 else f"{value:,.1f}"
            else:
                shown = f"{value:,}"
            rows.append((name, key, shown))
    return rows


def write_report(results: dict[str, dict], settings: Settings, run_id: str) -> Path:
    """Merge ``results`` into latest.json (keeping other sections) and write a timestamped copy."""
    out_dir = Path(settings.reports_dir) / "bench"
    out_dir.mkdir(parents=True, exist_ok=True)
    latest = out_dir / "latest.json"
    report = json.loads(latest.read_text()) if latest.exists() else {}
    report.setdefault("sections", {})
    for name, result in results.items():
        report["sections"][name] = {"run_id": run_id, **result}
    report["updated"] = run_id
    text = json.dumps(report, indent=2, sort_keys=False)
    latest.write_text(text + "\n")
    (out_dir / f"bench-{run_id}.json").write_text(text + "\n")
    return latest


def run(only: list[str] | None, events: int, settings: Settings | None = None, **context) -> dict[str, dict]:
    from infra.stack import Stack, port_listening

    settings = settings or get_settings()
    names = only or list(SECTIONS)
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        raise SystemExit(f"unknown section(s) {unknown}; known: {list(SECTIONS)}")
    stack = None
    if not port_listening(settings.kafka_port):
        print("no broker running: starting Kafka and Redis for the benchmark", file=sys.stderr)
        from infra.stack import BACKBONE

        stack = Stack(settings, service_types=BACKBONE)
        stack.up()
    ctx = BenchContext(settings=settings, events=events, **context)
    results: dict[str, dict] = {}
    try:
        for name in names:
            print(f"bench {name} ...", file=sys.stderr)
            t = time.perf_counter()
            try:
                results[name] = SECTIONS[name](ctx)
            except Exception as exc:  # one failing section must not lose the others
                results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            results[name]["seconds"] = round(time.perf_counter() - t, 1)
    finally:
        ctx.cleanup()
        if stack is not None:
            stack.down()
    path = write_report(results, settings, ctx.run_id)
    rows = [r for name, res in results.items() for r in _headline(name, res)]
    width = [max(len(r[i]) for r in rows + [("section", "metric", "value")]) for i in range(3)]
    print("  ".join(h.ljust(w) for h, w in zip(("section", "metric", "value"), width, strict=True)))
    for r in rows:
        print(f"{r[0].ljust(width[0])}  {r[1].ljust(width[1])}  {r[2].rjust(width[2])}")
    for name, res in results.items():
        if "error" in res:
            print(f"{name}: ERROR {res['error']}")
    print(f"-> {path}")
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m infra.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", action="append", help="run only this section (repeatable)")
    p.add_argument("--events", type=int, default=1_000_000, help="events per ingest run (default 1M)")
    p.add_argument("--keyed-seconds", type=int, default=120, help="keyed: seconds at each fixed rate")
    p.add_argument(
        "--keyed-rates", default="1000,5000,10000", help="keyed: comma-separated fixed rates, events/s"
    )
    p.add_argument(
        "--batch-events", type=int, default=1_000_000, help="batch_layer: the 10x log (default 1M events)"
    )
    a = p.parse_args(argv)
    rates = tuple(int(x) for x in a.keyed_rates.split(","))
    results = run(
        a.only, a.events, keyed_seconds=a.keyed_seconds, keyed_rates=rates, batch_events=a.batch_events
    )
    return 1 if any("error" in r for r in results.values()) else 0


# the keyed speed layer's and the batch layer's sections live in their own modules; importing
# them registers them
import infra.bench_batch  # noqa: E402,F401
import infra.bench_keyed  # noqa: E402,F401

if __name__ == "__main__":
    # run the imported module's main: `python -m` makes this file __main__, a second copy whose
    # SECTIONS the keyed section (registered on infra.bench) would not be in
    from infra.bench import main as _main

    sys.exit(_main())
