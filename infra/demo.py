"""``make demo``: the whole story end to end, on the local stack.

1. start the stack (Kafka, Redis, the speed layer and the API when the stack runs them);
2. append ~200k events to the log with the generator (small shares of invalid and duplicate
   records, server clock = wall clock so freshness is real);
3. wait until the speed layer has caught up with the log (the fences of the keyed state in Redis
   and the position of the Delta views, vs the topic's end offsets); when the stack runs no speed layer, run one in catch-up
   mode (``python -m pipelines.speed_layer --available-now``);
4. ``airflow dags test verify_views``: the live views equal a replay of the log at their position;
5. ``airflow dags test data_quality``: the Great Expectations suites;
6. when the stack runs the analytics (``SOCIAL_ANALYTICS=1``, the default): the alert patterns
   injected after step 2 fire on ``social.alerts``, and the analytics page is written;
7. a summary, where to look, how to stop.

``python -m infra.demo [--events N] [--no-airflow]`` (``--no-airflow`` calls the same entrypoints,
``python -m pipelines.verify`` / ``pipelines.quality``, without Airflow).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from infra.reports import write_index
from infra.settings import REPO_ROOT, Settings, get_settings
from pipelines.speed.functions import connect as keyed_connect


def say(msg: str) -> None:
    print(f"\n==> {msg}", flush=True)


def log_end_offsets(settings: Settings, topic: str) -> dict[int, int]:
    from infra.stack import end_offsets

    return end_offsets(settings, topic)


def committed_position(settings: Settings) -> dict[int, int]:
    """Per-partition end offsets both the keyed state (Redis) and the Delta views cover."""

    from pipelines import namespaces
    from pipelines.lake import committed_position as committed
    from pipelines.speed.functions import fences

    ns = namespaces.active(settings)
    found = committed(settings.lake_dir, ns)
    lake = found[1] if found else {}
    keyed = fences(keyed_connect(settings.redis_url), ns)
    return {p: min(lake.get(p, 0), keyed.get(p, 0)) for p in set(lake) | set(keyed)}


def wait_caught_up(
    settings: Settings, topic: str, timeout_s: float, proc: subprocess.Popen | None = None
) -> float:
    """Block until the speed layer covers the log's end; returns seconds waited."""
    from tqdm import tqdm

    target = log_end_offsets(settings, topic)
    total = sum(target.values())
    started = time.monotonic()
    with tqdm(
        total=total, unit="ev", unit_scale=True, desc="speed layer", mininterval=1, file=sys.stderr
    ) as bar:
        while True:
            pos = committed_position(settings)
            done = sum(min(pos.get(p, 0), end) for p, end in target.items())
            bar.update(done - bar.n)
            if done >= total:
                return time.monotonic() - started
            if proc is not None and proc.poll() is not None and proc.returncode != 0:
                raise SystemExit(f"the speed layer exited with {proc.returncode}; see its output above")
            if time.monotonic() - started > timeout_s:
                raise SystemExit(f"the speed layer did not catch up within {timeout_s:.0f}s ({done}/{total})")
            time.sleep(1)


def has_speed_layer_service() -> bool:
    from infra import stack

    return any(cls.name == "speed_layer" for cls in stack.SERVICES)


def analytics_rows(reports: Path) -> str:
    """Rows in each analytics table, from the page's summary.json (None: not written yet)."""
    try:
        tables = json.loads((reports / "analytics" / "summary.json").read_text())["tables"]
    except (OSError, ValueError, KeyError):
        return "-"
    return ", ".join(f"{name} {'-' if n is None else f'{n:,}'}" for name, n in tables.items())


def analytics_alerts(settings: Settings, user: int, timeout_s: float) -> dict[str, int]:
    """Alerts of ``user`` on the alerts topic per rule, waiting up to ``timeout_s`` for all three."""
    from confluent_kafka import Consumer

    from app_sim.generator import PATTERNS

    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": f"demo-{time.time_ns()}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([settings.alerts_topic])
    seen: dict[str, set[str]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while set(seen) < set(PATTERNS) and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                alert = json.loads(msg.value())
                if alert["user_id"] == user:
                    seen.setdefault(alert["rule"], set()).add(alert["alert_id"])
    finally:
        consumer.close()
    return {rule: len(ids) for rule, ids in sorted(seen.items())}


def run_job(dag_id: str, module: str, settings: Settings, use_airflow: bool) -> tuple[bool, float]:
    started = time.monotonic()
    if use_airflow:
        from infra.airflow import dags_test

        done = dags_test(dag_id, settings, capture=True)
        out = done.stdout + done.stderr
        lines = done.stdout.strip().splitlines()
        run = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
        for line in out.splitlines():
            if "Running command:" in line or "Command exited with return code" in line:
                print(f"  {line.strip()}")
        print(f"  DAG run {dag_id}: {run.get('state', 'did not finish')} {run.get('tasks', '')}")
        ok = done.returncode == 0
        if not ok:
            log = Path(settings.var_dir) / "log" / f"demo-{dag_id}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(out)
            print(f"{dag_id} failed; full output: {log}")
    else:
        env = {**os.environ, "SOCIAL_VAR_DIR": str(settings.var_dir)}
        ok = subprocess.run([sys.executable, "-m", module], cwd=REPO_ROOT, env=env).returncode == 0
    return ok, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m infra.demo", description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--users", type=int, default=None, help="simulated users (default: the generator's)")
    p.add_argument(
        "--no-airflow", action="store_true", help="call verify/quality directly, not via `airflow dags test`"
    )
    p.add_argument("--catch-up-timeout", type=float, default=900)
    args = p.parse_args(argv)
    settings = get_settings()
    topic = settings.events_topic
    t0 = time.monotonic()

    from app_sim.generator import GeneratorConfig, produce
    from infra.stack import Stack

    say("starting the stack (make up)")
    for name, outcome in Stack(settings).up().items():
        print(f"  {name:<12} {outcome}")

    say(f"appending {args.events:,} events to {topic} (0.5% invalid, 0.5% duplicates)")
    config = GeneratorConfig(
        **({"users": args.users} if args.users else {}),
        seed=random.SystemRandom().randrange(1, 2**31),  # a new run appends new ids, never replays old ones
        invalid_share=0.005,
        duplicate_share=0.005,
        realtime=True,
    )
    gen = produce(args.events, config, topic=topic, bootstrap=settings.kafka_bootstrap, progress=True)
    print(f"  {gen.events:,} events in {gen.seconds:.1f}s = {gen.events_per_s:,.0f} events/s")
    if gen.delivery_failures:
        print(f"  {gen.delivery_failures} delivery failures")
        return 1

    if settings.analytics:
        from app_sim.generator import PATTERNS, inject

        say("injecting the alert patterns (burst, follow churn, message flood) by user 1")
        print(f"  {inject(list(PATTERNS), topic=topic, bootstrap=settings.kafka_bootstrap, user=1)} events")

    say("waiting for the speed layer to catch up with the log")
    proc = None
    if not has_speed_layer_service():
        print("  (the stack runs no speed layer: running one in catch-up mode, --available-now)")
        env = {**os.environ, "SOCIAL_VAR_DIR": str(settings.var_dir)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipelines.speed_layer", "--available-now"],
            cwd=REPO_ROOT,
            env=env,
            stdout=(Path(settings.log_dir) / "speed_layer-demo.log").open("ab"),
            stderr=subprocess.STDOUT,
        )
    try:
        waited = wait_caught_up(settings, topic, args.catch_up_timeout, proc)
        if proc is not None:
            proc.wait(timeout=300)
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)
    print(f"  caught up {waited:.0f}s after the last event was acknowledged")

    via = "airflow dags test" if not args.no_airflow else "python -m"
    say(f"verify_views ({via}): live views vs. a replay of the log")
    verified, verify_s = run_job("verify_views", "pipelines.verify", settings, not args.no_airflow)
    say(f"data_quality ({via}): Great Expectations suites")
    quality_ok, quality_s = run_job("data_quality", "pipelines.quality", settings, not args.no_airflow)

    alerts, page = {}, None
    if settings.analytics:
        say("stream analytics: the injected alerts on social.alerts, and the analytics page")
        alerts = analytics_alerts(settings, 1, timeout_s=300)
        env = {**os.environ, "SOCIAL_VAR_DIR": str(settings.var_dir)}
        done = subprocess.run(
            [sys.executable, "-m", "pipelines.analytics.report"],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        page = done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else None

    reports = Path(settings.reports_dir)
    verify_json = reports / "verify" / "latest.json"
    report = json.loads(verify_json.read_text()) if verify_json.exists() else {}
    views = report.get("views", {})
    fresh = report.get("freshness", {})
    acct = report.get("accounting", {})
    say("summary")
    rows = [
        ("events appended", f"{gen.events:,} at {gen.events_per_s:,.0f} events/s"),
        ("speed layer caught up", f"{waited:.0f}s after the last event"),
        (
            "freshness p50 / p99",
            f"{fresh.get('p50_ms', '-')} ms / {fresh.get('p99_ms', '-')} ms (receive -> visible)",
        ),
        (
            "rows verified",
            f"{sum(v.get('recomputed_rows', 0) for v in views.values()):,} in {len(views)} views ({verify_s:.0f}s)",
        ),
        (
            "mismatches",
            f"{sum(v.get('mismatches', 0) for v in views.values())} -> verify {'OK' if verified and report.get('ok') else 'FAILED'}",
        ),
        (
            "accounting",
            f"read {acct.get('events_read', '-')} = applied {acct.get('applied', '-')} + duplicates "
            f"{acct.get('duplicates', '-')} + quarantined {acct.get('quarantined', '-')}",
        ),
        ("data quality", f"{'OK' if quality_ok else 'FAILED'} ({quality_s:.0f}s)"),
        (
            "alerts fired (user 1)",
            (", ".join(f"{r} {n}" for r, n in alerts.items()) or "none yet (see var/log/analytics.log)")
            if settings.analytics
            else "analytics off (SOCIAL_ANALYTICS=0)",
        ),
        ("analytics page", page or "-"),
        ("analytics rows", analytics_rows(Path(settings.reports_dir)) if page else "-"),
        ("verify report", f"{verify_json} (+ latest.html)"),
        ("quality Data Docs", str(reports / "quality" / "index.html")),
        ("every report", str(write_index(settings))),
        ("total", f"{time.monotonic() - t0:.0f}s"),
    ]
    for k, v in rows:
        print(f"  {k:<22} {v}")
    say("look around")
    from pipelines import namespaces

    ns, redis_cli = namespaces.active(settings), f"redis-cli -p {settings.redis_port}"
    hints = [
        ("make status", "what runs, pids, ports, logs"),
        (f"{redis_cli} get active_namespace", "the live views version"),
        (f"{redis_cli} hgetall {ns}:fence", "the log position the keyed state covers (its fences)"),
        (f"{redis_cli} --scan --pattern '{ns}:tl:*' | head", "home timelines"),
        (f"curl -s 127.0.0.1:{settings.api_port}/v1/health", "the API"),
        ("python -m pipelines.rebuild run", "blue/green rebuild of every view (undo: ... rollback)"),
        ('eval "$(python -m infra.airflow env)"; airflow dags list', "this project's Airflow"),
        (
            "make airflow",
            f"Airflow UI on 127.0.0.1:{settings.airflow_port} (no login; DAGs start paused)",
        ),
        ("make tail", "the log, record by record (Kafka's console consumer)"),
        ("make history", "Spark History Server on the finished jobs: 127.0.0.1:18080"),
        ("make down", "stop everything"),
    ]
    width = max(len(cmd) for cmd, _ in hints)
    print("\n".join(f"  {cmd.ljust(width)}  {what}" for cmd, what in hints))
    return 0 if verified and quality_ok else 1


if __name__ == "__main__":
    sys.exit(main())
