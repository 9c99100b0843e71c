"""``make bench``: side-by-side benchmarks, each a ratio measured in one run.

Absolute rates on a shared 2-core machine are noise; a ratio against a reference measured in the
same run, on the same broker, is not. Each section is a function ``(BenchContext) -> dict``
registered with ``@section(name)``; results are merged into ``var/reports/bench/latest.json``
(other sections' earlier results are kept), a timestamped copy is written next to it, and a short
table is printed.

``python -m stories.bench [--only ingest] [--events N]``. Uses the running local stack if Kafka
answers on the configured port, else starts one (``infra.stack``) and stops it afterwards; a run of
only standalone sections (``redis_cluster``, which starts the servers it compares) starts none.

Sections, in order: ``ingest`` (the generator vs Kafka's own ``ProducerPerformance``);
``serving`` (the API's reads/s and p99 under Locust over a pre-populated serving store, writes/s
too; then one home timeline read under ``hey``, a Go load generator built on first use,
``infra/hey.py``); ``replay`` (full recompute vs a bare read and vs the parse step alone, 1x and
10x log);
``keyed`` and ``scaling`` (``stories/bench_keyed.py``: the keyed speed layer; the processor's
cost per micro-batch on 1x and 10x state); ``analytics`` (``stories/bench_analytics.py``: the keyed speed layer's
freshness with and without the analytics beside it, their own latency, state size and batch
duration curves); ``cluster_scaling`` (``stories/bench_cluster.py``: the keyed speed layer with 1
and 3 Kafka brokers, and on ``local`` Spark and 1 and 2 standalone workers); ``sealing``
(``stories/bench_sealing.py``: the generator's and the API's write throughput with personal data
sealed and in plaintext); ``catchup`` (``stories/bench_catchup.py``: the default 200k log caught up
by the running speed layer fully fanned out and at the default threshold: events/s, Redis µs and
commands per event); ``threshold`` (``stories/bench_threshold.py``: the cost model the default
fan-out threshold is chosen from, measured on the same log); ``read_heavy``
(``stories/bench_read_heavy.py``: timeline reads under hey beside the generator's writes at
rising rates, the speed layer at the default threshold; the highest write rate whose reads keep
p99 <= 50 ms at >= 20 reads per post); ``archive`` (``stories/bench_archive.py``: the default
history archived and compacted, then 1,000 more events on that lake, beside a bare Spark read of
the same offsets); ``dedup`` (``stories/bench_dedup.py``: the dedup memory after the default log
and after one five times as long from the same writer, beside the same log with UUID event ids,
and what a day at 9,000 events/s needs); ``redis_cluster`` (``stories/bench_redis_cluster.py``:
timeline writes/s and Redis CPU per timeline write on one Redis master and on a 3-master Redis
Cluster, alternately, with the processor in 2 processes and ``redis-benchmark``'s ZADDs on both as
the yardstick). docs/reports.md says how to read each figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from contract.functions import connect as keyed_connect
from infra.cli import command_name, run_main
from infra.settings import Settings, get_settings
from stories.bench_common import (
    SECTIONS,
    STANDALONE,
    BenchContext,
    backbone_unless_running,
    section,
    stream_settings,
)

# --- ingest -------------------------------------------------------------------------------------------

PERF_TOOL = "org.apache.kafka.tools.ProducerPerformance"
_PERF_LINE = re.compile(
    r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, "
    r"([\d.]+) ms max latency(?:, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th)?"
)


def _java_producer_props(bootstrap: str) -> list[str]:
    """The generator's producer settings, in Java client names (same durability, same batching)."""
    from infra import clients

    cfg = clients.producer_config(bootstrap, "bench.producer_performance", profile="throughput")
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
    from infra import clients
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
        # the security settings (a password among them) from a file, not the command line
        "--command-config",
        str(clients.java_security_file(settings, settings.run_dir / "bench-producer.properties")),
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

    summary = produce(n, cfg, topic=ctx.topic("ingest-generator"), bootstrap=ctx.settings, progress=False)

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


def populate_serving_store(settings: Settings, namespace: str, users: int, seed: int) -> list[int]:
    """A serving store as the speed layer leaves it, written directly (key layout of ServingStore).

    Users follow others by the generator's heavy-tailed graph (``app_sim.graph``); each home
    timeline holds the latest 50 posts of the user and the followees at or under the fan-out
    threshold (the others are merged at read time, as the speed layer leaves them), every user has a status,
    a few inbox messages and an unread count. Returns the user ids.
    """
    import numpy as np
    import orjson

    from app_sim import graph
    from contract.serving import ServingStore, _pid, connect, timeline_member_of

    rng = np.random.default_rng(seed)
    edges = graph.follower_graph(users, 20.0, rng)
    store = ServingStore(connect(settings.redis_url), namespace)
    k, r = store.k, store.r
    posts_per_user = 10
    post_ids = {u: [u * 1000 + i for i in range(posts_per_user)] for u in range(1, users + 1)}
    following: dict[int, list[int]] = {u: [] for u in range(1, users + 1)}
    followers: dict[int, int] = dict.fromkeys(following, 0)
    for a, b in edges.tolist():
        following[a].append(b)
        followers[b] += 1
    # the hybrid rule as the speed layer applies it: authors over the threshold are merged at read
    # time, not fanned out (SOCIAL_FANOUT_THRESHOLD decides how much of the read is a merge)
    celebs = {a for a, n in followers.items() if n > settings.fanout_threshold}
    pipe = r.pipeline(transaction=False)
    if celebs:
        pipe.sadd(k("celebs"), *sorted(celebs))
    for u in range(1, users + 1):
        pipe.hset(k("users"), u, orjson.dumps({"handle": f"u{u}", "display_name": f"User {u}"}))
        pipe.hset(k("status"), u, orjson.dumps({"text": f"status of {u}", "event_time": 1}))
        for i, pid in enumerate(post_ids[u]):
            body = {"post_id": pid, "author_id": u, "text": "x" * int(rng.integers(20, 200)), "event_time": i}
            pipe.set(k("p", u, pid), orjson.dumps(body))
            pipe.zadd(k("posts", u), {_pid(pid): i * users + u})
        authors = [u, *(a for a in following[u] if a not in celebs)]
        candidates = [(i * users + a, post_ids[a][i], a) for a in authors for i in range(posts_per_user)]
        top = sorted(candidates, reverse=True)[:50]
        pipe.zadd(k("tl", u), {timeline_member_of(pid, a): score for score, pid, a in top})
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


# hey's target for one home timeline read (issue 53): a 50-post timeline at this rate and p99
HEY_TARGET_READS_PER_S = 3_000
HEY_TARGET_P99_MS = 50.0


def timeline_users(settings: Settings, namespace: str, users: list[int]) -> tuple[dict, dict]:
    """The two users hey reads the timeline of: one with many followees, one with an empty timeline.

    The first is the user at the 90th percentile of follow counts in the store (ties by id):
    "many followees" without the one outlier of the heavy tail (the most-following user's read
    merges hundreds of celebrities' lists). The second is added here: a profile, no post, no follow.
    """
    from contract.serving import ServingStore, connect

    store = ServingStore(connect(settings.redis_url), namespace)
    pipe = store.r.pipeline(transaction=False)
    for u in users:
        pipe.scard(store.k("following", u))
    follows = dict(zip(users, pipe.execute(), strict=True))
    ranked = sorted(users, key=lambda u: (follows[u], u))
    many = ranked[int(0.9 * (len(ranked) - 1))]
    celebs = store.r.sinter(store.k("following", many), store.k("celebs"))
    empty = max(users) + 1
    store.r.hset(store.k("users"), empty, '{"handle": "u_empty", "display_name": "Nobody Followed"}')
    return (
        {
            "user_id": many,
            "follows": follows[many],
            "celebrities_merged_at_read": len(celebs),
            "follow_rank": "p90 of the store's users",
        },
        {"user_id": empty, "follows": 0, "celebrities_merged_at_read": 0},
    )


def _hey_timeline(url: str, token: str, who: dict, seconds: int, connections: int) -> dict:
    """One GET of the timeline (what the read returns), then hey on it for ``seconds``."""
    import urllib.request

    from infra.hey import HEY_VERSION, run_hey

    headers = {"Authorization": f"Bearer {token}"}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as resp:
        posts = json.loads(resp.read())["posts"]
    figures = run_hey(url, seconds=seconds, connections=connections, headers=headers)
    return {
        **who,
        "posts": len(posts),
        "distinct_authors": len({p["author_id"] for p in posts}),
        "tool": f"hey {HEY_VERSION}",
        **figures,
    }


def _vs_target(name: str, result: dict) -> dict:
    reads, p99 = result["reads_per_s"], result["p99_ms"]
    return {
        f"{name}_vs_target": round(reads / HEY_TARGET_READS_PER_S, 2),
        f"{name}_p99_vs_target": round(p99 / HEY_TARGET_P99_MS, 2) if p99 is not None else None,
        f"{name}_target_met": reads >= HEY_TARGET_READS_PER_S
        and p99 is not None
        and p99 <= HEY_TARGET_P99_MS,
    }


@section("serving")
def serving(ctx: BenchContext) -> dict:
    """Reads/s and p99 of the API under Locust (2 workers + Locust on this machine), writes too;
    then one user's home timeline under hey (Go), a 50-post one and an empty one."""
    import orjson

    from app_sim.auth import TokenSigner, load_secret
    from app_sim.load import run_locust
    from infra.stack import ApiServer, free_port_block

    port = free_port_block(1)  # below the ephemeral range: no outgoing connection takes it first
    namespace = f"bench-serving-{ctx.run_id}".lower()
    settings = stream_settings(ctx, "serving", ctx.topic("serving"), namespace, api_port=port)
    users = populate_serving_store(settings, namespace, users=2000, seed=11)
    many, empty = timeline_users(settings, namespace, users)
    signer = TokenSigner(load_secret(settings))
    out_dir = Path(ctx.settings.reports_dir) / "bench" / "serving"
    out_dir.mkdir(parents=True, exist_ok=True)
    users_file = out_dir / "users.json"
    users_file.write_text(orjson.dumps([[u, signer.issue(u)] for u in users]).decode())
    url = f"http://127.0.0.1:{port}"
    api = ApiServer(settings)
    api.start()
    try:
        summary = run_locust(
            url,
            out_dir,
            users=ctx.serving_users,
            spawn_rate=ctx.serving_users,
            run_time_s=ctx.serving_seconds,
            extra_env={"LOAD_USERS_FILE": str(users_file)},
        )
        # hey after Locust, on the same API: Locust's writes go to the log (no speed layer runs
        # here), so both users' timelines are as loaded
        hey = _hey_timelines(ctx, url, signer, (("hey_timeline_50", many), ("hey_timeline_empty", empty)))
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
        "hey_target": f"GET /v1/timeline >= {HEY_TARGET_READS_PER_S}/s with p99 <= {HEY_TARGET_P99_MS:g} ms "
        f"(hey, {ctx.serving_hey_connections} connections, {ctx.serving_hey_seconds} s per user)",
        **hey,
    }


def _hey_timelines(ctx: BenchContext, url: str, signer, who: tuple[tuple[str, dict], ...]) -> dict:
    """Each named user's home timeline under hey, with its verdict against the target; without
    hey (it could not be built or run), the error instead: the Locust figures stand without it."""
    from infra.hey import HeyError

    hey: dict = {}
    try:
        for name, user in who:
            token = signer.issue(user["user_id"])
            result = _hey_timeline(
                f"{url}/v1/timeline?limit=50",
                token,
                user,
                ctx.serving_hey_seconds,
                ctx.serving_hey_connections,
            )
            hey[name] = result
            hey.update(_vs_target(name, result))
    except HeyError as exc:
        print(f"serving: hey: {exc}", file=sys.stderr)
        hey["hey_error"] = str(exc)
    return hey


def _drop_namespace(settings: Settings, namespace: str) -> None:

    from contract.functions import drop_namespace

    drop_namespace(keyed_connect(settings.redis_url), namespace)


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
    settings = settings or get_settings()
    names = only or list(SECTIONS)
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        raise SystemExit(f"unknown section(s) {unknown}; known: {list(SECTIONS)}")
    results: dict[str, dict] = {}
    standalone = all(n in STANDALONE for n in names)
    with contextlib.nullcontext() if standalone else backbone_unless_running(settings, "benchmark"):
        ctx = BenchContext(settings=settings, events=events, **context)
        try:
            for name in names:
                print(f"bench {name} ...", file=sys.stderr)
                t = time.perf_counter()
                try:
                    results[name] = SECTIONS[name](ctx)
                except Exception as exc:  # one failing section must not lose the others
                    traceback.print_exc()  # where it failed, on stderr; the report keeps the message
                    results[name] = {"error": f"{type(exc).__name__}: {exc}"}
                results[name]["seconds"] = round(time.perf_counter() - t, 1)
        finally:
            ctx.cleanup()
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
    p = argparse.ArgumentParser(prog=command_name("stories.bench"), description=__doc__.split("\n\n")[0])
    p.add_argument("--only", action="append", help="run only this section (repeatable)")
    p.add_argument("--events", type=int, default=1_000_000, help="events per ingest run (default 1M)")
    p.add_argument("--keyed-seconds", type=int, default=120, help="keyed: seconds at each fixed rate")
    p.add_argument(
        "--keyed-rates", default="1000,5000,10000", help="keyed: comma-separated fixed rates, events/s"
    )
    p.add_argument(
        "--analytics-seconds",
        type=int,
        default=120,
        help="analytics: seconds of load per phase (alone, with the analytics); the curves span the second",
    )
    p.add_argument(
        "--analytics-alone-seconds",
        type=int,
        help="analytics: seconds of the first phase (without the analytics) if shorter: a 30-minute "
        "curves run needs the long second phase only (the freshness ratio is then withheld)",
    )
    p.add_argument("--analytics-rate", type=int, default=2_000, help="analytics: events/s (2000)")
    p.add_argument(
        "--batch-events", type=int, default=1_000_000, help="batch_layer: the 10x log (default 1M events)"
    )
    # the cluster_scaling options default to BenchContext's, written once there
    for option, field_name, what in (
        ("--cluster-seconds", "cluster_seconds", "seconds at the fixed rate per configuration"),
        ("--cluster-rate", "cluster_rate", "the fixed rate, events/s"),
        ("--cluster-burst-events", "cluster_burst_events", "the backlog drained (throughput)"),
        ("--erasure-log-events", "erasure_log_events", "the log the 10,000-event user is erased from"),
        ("--catchup-events", "catchup_events", "the default log the speed layer catches up"),
        ("--archive-events", "archive_events", "the events archived on a lake holding that log"),
        ("--redis-cluster-partitions", "redis_cluster_partitions", "the log's partitions"),
        ("--redis-cluster-pairs", "redis_cluster_pairs", "1-master and 3-master runs, alternately"),
    ):
        default = getattr(BenchContext, field_name)
        p.add_argument(
            option, type=int, default=default, help=f"{field_name.split('_')[0]}: {what} ({default})"
        )
    a = p.parse_args(argv)
    rates = tuple(int(x) for x in a.keyed_rates.split(","))
    results = run(
        a.only,
        a.events,
        keyed_seconds=a.keyed_seconds,
        keyed_rates=rates,
        analytics_seconds=a.analytics_seconds,
        analytics_alone_seconds=a.analytics_alone_seconds,
        analytics_rate=a.analytics_rate,
        batch_events=a.batch_events,
        cluster_seconds=a.cluster_seconds,
        cluster_rate=a.cluster_rate,
        cluster_burst_events=a.cluster_burst_events,
        erasure_log_events=a.erasure_log_events,
        catchup_events=a.catchup_events,
        archive_events=a.archive_events,
        redis_cluster_partitions=a.redis_cluster_partitions,
        redis_cluster_pairs=a.redis_cluster_pairs,
    )
    return 1 if any("error" in r for r in results.values()) else 0


# the other sections live in their own modules; importing them registers them, in this order: keyed
# and scaling first, then the others by module name
import stories.bench_keyed  # noqa: E402,F401
import stories.bench_layouts  # noqa: E402,F401

# isort: split
import stories.bench_analytics  # noqa: E402,F401
import stories.bench_archive  # noqa: E402,F401
import stories.bench_batch  # noqa: E402,F401
import stories.bench_catchup  # noqa: E402,F401
import stories.bench_cluster  # noqa: E402,F401
import stories.bench_compacted  # noqa: E402,F401
import stories.bench_dedup  # noqa: E402,F401
import stories.bench_erasure  # noqa: E402,F401
import stories.bench_read_heavy  # noqa: E402,F401
import stories.bench_redis_cluster  # noqa: E402,F401
import stories.bench_sealing  # noqa: E402,F401
import stories.bench_threshold  # noqa: E402,F401

if __name__ == "__main__":
    sys.exit(run_main(main, "stories.bench"))
