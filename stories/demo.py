"""``make demo``: the whole story end to end, on the local stack.

1. start the stack (Kafka, Redis, the speed layer, the archiver, the analytics and the API);
2. append the **history** with the generator: ``--events`` records (``DEMO_EVENTS``, 200k; small
   shares of invalid and duplicate records) of ``--users`` users (``DEMO_USERS``) on the
   generator's simulated server clock, at a social app's pace (``--events-per-user-s``, 0.02: a
   user acts every ~50 s on average, the most active ones every few seconds), ending just before
   now: 200k events of 1,000 users span ~2.8 h of event time, so the analytics' windows close
   and ordinary users rarely trip an alert rule. It is written as fast as Kafka takes it; the
   serving path's progress bar (its fences in Redis) follows it;
3. a **live** part in real time: the same world, paced at its own rate for ``--live-seconds``
   (``DEMO_LIVE_SECONDS``, 30), so the serving path's freshness (server receive -> visible in
   Redis, the speed layer's own histogram) is measured on events that arrive as a live app's do;
4. the alert patterns (burst, follow churn, message flood) injected by one user, when the stack
   runs the analytics (``SOCIAL_ANALYTICS=1``, the default);
5. wait until the serving path (the fences in Redis) and the archive (the Delta views' position)
   cover the log's end, each with its own progress bar; when the stack runs no speed layer, one
   runs in catch-up mode (``python -m pipelines.speed_layer --available-now``);
6. ``airflow dags test verify_views``: the live views equal a replay of the log at their position;
7. ``airflow dags test data_quality``: the Great Expectations suites (``--no-quality``: skipped);
8. the injected alerts on ``social.alerts``, and the analytics page;
9. a summary (every line below, :data:`SUMMARY`), where to look, how to stop. Exit 1 unless the
   verify and the quality checks pass (verify alone with ``--no-quality``).

``python -m stories.demo [--events N] [--users N] [--live-seconds S] [--no-airflow] [--no-quality]``
(``--no-airflow`` calls the same entrypoints, ``python -m pipelines.verify`` /
``pipelines.quality``, without Airflow; ``--no-quality`` skips the quality step, for a test that
checks the quality elsewhere and keeps to a time limit). The stack's ports and var dir are the settings'
(``SOCIAL_KAFKA_PORT``, ``SOCIAL_REDIS_PORT``, ``SOCIAL_API_PORT``, ``SOCIAL_VAR_DIR``, ...):
``tests/integration/test_demo.py`` runs it on its own.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from contract.functions import connect as keyed_connect
from infra import clients
from infra.cli import command_name, run_main
from infra.reports import write_index
from infra.settings import REPO_ROOT, Settings, get_settings

if TYPE_CHECKING:
    from app_sim.generator import GeneratorConfig, Summary

# A social app's pace: events per user per second of event time (a user acts every ~50 s on
# average; activity is heavy-tailed, so the busiest users act every few seconds). The burst rule
# (more than 10 posts in a 10 s window, sliding by 5 s) over a 200k-event history of 1,000 users,
# replayed from the generator's events by corrected event time (2026-11-28): 236 windows at 0.1
# (the generator's default), 80 at 0.05, 9 at 0.03, 1 at 0.02; no follow churn or message flood
# at 0.05 or below.
EVENTS_PER_USER_S = 0.02

# Every line the summary prints, in order (tests/integration/test_demo.py requires each).
SUMMARY = (
    "events appended",
    "event time",
    "serving path",
    "archive",
    "freshness (serving)",
    "archive lag",
    "rows verified",
    "mismatches",
    "accounting",
    "data quality",
    "alerts fired",
    "analytics page",
    "analytics rows",
    "verify report",
    "quality Data Docs",
    "every report",
    "total",
)


def say(msg: str) -> None:
    print(f"\n==> {msg}", flush=True)


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw else default


def serving_position(settings: Settings, namespace: str, partitions: int | None = None) -> dict[int, int]:
    """The serving path's position: the fences of the keyed state in Redis (partition -> next offset;
    in the partitioned layout, of the event topic's ``partitions``, each with its deliveries in)."""
    from contract.functions import layout_fences

    return layout_fences(
        keyed_connect(settings.redis_url),
        namespace,
        settings.serving_layout,
        partitions or settings.events_partitions,
    )


def archive_position(settings: Settings, namespace: str) -> dict[int, int]:
    """The archive's position: the end offsets the latest Delta ``batches`` commit covers (the
    Delta views; read from the Delta log alone, no Spark)."""
    from pipelines.lake import committed_position

    found = committed_position(settings.lake_dir, namespace)
    return found[1] if found else {}


def archived_position(settings: Settings, namespace: str) -> dict[int, int]:
    """The raw archive's position: the end offsets of the latest ``archives`` commit (the changelog,
    ``events_bronze`` and ``quarantine`` in Delta, not compacted into the views yet)."""
    from pipelines.lake import archived

    done = archived(settings.lake_dir, namespace)
    return done.end_offsets if done else {}


def covered(position: dict[int, int], target: dict[int, int]) -> int:
    """Records of ``target`` (partition -> end offset) that ``position`` covers."""
    return sum(min(position.get(p, 0), end) for p, end in target.items())


@dataclass
class Progress:
    """When each path reached the target (monotonic seconds), and where it stood when last asked."""

    reached: dict[str, float] = field(default_factory=dict)
    done: dict[str, int] = field(default_factory=dict)


def wait_caught_up(
    settings: Settings,
    namespace: str,
    target: dict[int, int],
    paths: tuple[str, ...],
    timeout_s: float,
    proc: subprocess.Popen | None = None,
) -> Progress:
    """Block until each of ``paths`` (``serving``: the fences in Redis; ``archived``: the raw
    archive in Delta; ``archive``: the Delta views' position, compacted) covers ``target``, drawing
    one progress bar per path that moves as it does."""
    from tqdm import tqdm

    readers = {
        "serving": lambda s, ns: serving_position(s, ns, len(target)),
        "archived": archived_position,
        "archive": archive_position,
    }
    labels = {"serving": "serving (Redis)", "archived": "archived (Delta)", "archive": "views (Delta)"}
    total = sum(target.values())
    progress = Progress()
    started = time.monotonic()
    bars = {
        name: tqdm(
            total=total,
            initial=covered(readers[name](settings, namespace), target),  # its rate: from here on
            unit="ev",
            unit_scale=True,
            desc=f"{labels[name]:<17}",
            mininterval=0.5,
            position=i,
            file=sys.stderr,
        )
        for i, name in enumerate(paths)
    }
    try:
        while True:
            for name in paths:
                if name in progress.reached:
                    continue
                done = covered(readers[name](settings, namespace), target)
                progress.done[name] = done
                bars[name].update(done - bars[name].n)
                if done >= total:
                    progress.reached[name] = time.monotonic()
                    bars[name].close()  # its time and rate stop here, not when the other path is done
            if len(progress.reached) == len(paths):
                return progress
            if proc is not None and proc.poll() is not None and proc.returncode != 0:
                raise SystemExit(f"the speed layer exited with {proc.returncode}; see its output above")
            if time.monotonic() - started > timeout_s:
                behind = {
                    n: f"{progress.done.get(n, 0):,}/{total:,}" for n in paths if n not in progress.reached
                }
                raise SystemExit(f"not caught up within {timeout_s:.0f}s: {behind}")
            time.sleep(0.5)
    finally:
        for bar in bars.values():
            bar.close()


class ArchiveWatch:
    """When the archive (the Delta views' position) first covers ``target``: polled in a thread
    of its own from the history's first append on, while the demo goes on with the live part."""

    def __init__(self, settings: Settings, namespace: str, target: dict[int, int]):
        import threading

        self.reached: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(settings, namespace, target), name="archive-watch", daemon=True
        )
        self._thread.start()

    def _run(self, settings: Settings, namespace: str, target: dict[int, int]) -> None:
        total = sum(target.values())
        while not self._stop.is_set():
            try:
                if covered(archive_position(settings, namespace), target) >= total:
                    self.reached = time.monotonic()
                    return
            except (OSError, ValueError):  # a commit being written: read it next time
                pass
            self._stop.wait(0.5)

    def stop(self) -> float | None:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.reached


def has_speed_layer_service() -> bool:
    from infra import stack

    return any(cls.name == "speed_layer" for cls in stack.SERVICES)


# --- the serving path's freshness: the speed layer's own histogram, over the live part ------------


def freshness_histogram(settings: Settings, namespace: str) -> dict[int, int]:
    """The speed layer's freshness histogram (10 ms bucket -> events, received -> visible in Redis:
    in the partitioned layout, delivered to every partition)."""
    from contract import functions
    from pipelines.speed.stream import topic_partitions

    layout = settings.serving_layout
    partitions = topic_partitions(settings, settings.events_topic) if layout == "partitioned" else ()
    return functions.freshness_histogram(keyed_connect(settings.redis_url), namespace, layout, partitions)


def histogram_since(now: dict[int, int], before: dict[int, int]) -> dict[int, int]:
    """The events a histogram counted since ``before`` was read (bucket -> events)."""
    out = {b: n - before.get(b, 0) for b, n in now.items()}
    return {b: n for b, n in out.items() if n > 0}


def percentiles(hist: dict[int, int], bucket_ms: int) -> dict:
    """p50/p99/max (ms, the upper edge of the bucket) of a bucket -> events histogram
    (:func:`pipelines.metrics.percentile`, as ``make status`` reads it)."""
    from pipelines.metrics import percentile

    out: dict = {"events": sum(hist.values())}
    for name, q in (("p50_ms", 0.5), ("p99_ms", 0.99), ("max_ms", 1.0)):
        out[name] = percentile(hist, bucket_ms, q)
    return out


# --- the verify report, in the summary's terms --------------------------------------------------------


def mismatches(report: dict) -> dict[str, int | None]:
    """Every comparison of the verify report with its number of disagreements (None: skipped)."""

    def total(part) -> int | None:
        if not isinstance(part, dict) or part.get("ok") is None:
            return None
        if "mismatches" in part:
            return int(part["mismatches"])
        return sum(int(v.get("mismatches", 0)) for v in part.values() if isinstance(v, dict))

    views = report.get("views", {})
    return {
        "Delta views vs recomputed": sum(int(v.get("mismatches", 0)) for v in views.values()),
        "Redis vs Delta": total(report.get("serving")),
        "keyed state vs replay": total(report.get("keyed")),
        "keyed state vs batch layer": total(report.get("batch_layer")),
    }


def analytics_rows(reports: Path) -> str:
    """Rows in each analytics table, from the page's summary.json, with the reason for any empty one."""
    try:
        data = json.loads((reports / "analytics" / "summary.json").read_text())
        tables = data["tables"]
    except (OSError, ValueError, KeyError):
        return "not written (see var/log/analytics.log)"
    why = data.get("empty_because", {})
    return ", ".join(
        f"{name} {'-' if n is None else f'{n:,}'}" + (f" ({why[name]})" if not n and name in why else "")
        for name, n in tables.items()
    )


def analytics_alerts(settings: Settings, user: int, timeout_s: float) -> dict[str, dict[str, int]]:
    """Alerts on the alerts topic per rule: of ``user`` (waiting up to ``timeout_s`` for all three
    patterns) and of everyone else."""

    from app_sim.generator import PATTERNS

    consumer = clients.kafka_consumer(settings, f"demo-{time.time_ns()}", {"auto.offset.reset": "earliest"})
    consumer.subscribe([settings.alerts_topic])
    seen: dict[str, dict[str, set[str]]] = {"injected": {}, "others": {}}
    deadline = time.monotonic() + timeout_s
    quiet_until = None
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                alert = json.loads(msg.value())
                who = "injected" if alert["user_id"] == user else "others"
                seen[who].setdefault(alert["rule"], set()).add(alert["alert_id"])
            if set(seen["injected"]) >= set(PATTERNS):
                # all three fired: read on until the topic has been quiet for a few seconds
                if msg is not None:
                    quiet_until = time.monotonic() + 3
                elif quiet_until is None or time.monotonic() > quiet_until:
                    break
    finally:
        consumer.close()
    return {who: {rule: len(ids) for rule, ids in sorted(rules.items())} for who, rules in seen.items()}


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


def history_config(users: int | None, events: int, per_user_s: float, now_ms: int):
    """The history's generator config: the simulated clock at ``per_user_s`` events per user per
    second, starting so that the run ends just before ``now_ms`` (a margin for the clock's
    randomness: its steps are exponential, the sum's spread ~sqrt(events) steps)."""
    from app_sim.generator import GeneratorConfig

    base = GeneratorConfig(**({"users": users} if users else {}))
    step_ms = 1000.0 / (per_user_s * base.users)
    span_ms = events * step_ms
    margin_ms = 60_000 + 0.02 * span_ms
    return GeneratorConfig(
        users=base.users,
        seed=random.SystemRandom().randrange(1, 2**31),  # a new run appends new ids, never replays old ones
        invalid_share=0.005,
        duplicate_share=0.005,
        sim_events_per_user_s=per_user_s,
        start_ms=int(now_ms - span_ms - margin_ms),
    )


@dataclass
class Paced:
    events: int
    seconds: float
    delivery_failures: int
    duplicates: int  # exact re-sends the generator injected (the speed layer must count them all)


def produce_paced(n: int, config, rate: float, *, topic: str, bootstrap: clients.Kafka) -> Paced:
    """``n`` generator records written one by one at ``rate`` per second, each made (and stamped by
    the generator's wall clock, ``realtime``) when it is due: a live app's arrivals, not bursts
    (``produce``'s ``rate`` paces in blocks of 64 records)."""
    import orjson
    from tqdm import tqdm

    from app_sim.generator import DUPLICATE, EventGenerator

    if config.worker_id is None:  # a writer of its own: its event ids count from 1 under its id
        from contract import writers

        config = dataclasses.replace(
            config, worker_id=writers.allocate_for(bootstrap, topic, "generator").worker_id
        )
    failures = duplicates = 0

    def on_delivery(err, _msg) -> None:
        nonlocal failures
        failures += err is not None

    producer = clients.kafka_producer(bootstrap, "demo.live", on_delivery=on_delivery)
    records = EventGenerator(n, config).records()
    start = time.perf_counter()
    with tqdm(total=n, unit="ev", desc="live", mininterval=0.5, file=sys.stderr) as bar:
        for i in range(n):
            due = start + i / rate - time.perf_counter()
            if due > 0:
                producer.poll(due)
                while (due := start + i / rate - time.perf_counter()) > 0:
                    time.sleep(due)
            key, value, injected = next(records)  # made now: its received_time is now
            duplicates += injected == DUPLICATE
            producer.produce(topic, value if isinstance(value, bytes) else orjson.dumps(value), key)
            producer.poll(0)
            bar.update(1)
    failures += producer.flush(60)
    return Paced(
        events=n,
        seconds=round(time.perf_counter() - start, 1),
        delivery_failures=failures,
        duplicates=duplicates,
    )


def _ms(t: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _rate(n: int, seconds: float) -> str:
    return f"{n / max(seconds, 1e-3):,.0f} events/s"


# --- the run, phase by phase -----------------------------------------------------------------------


def parse_args(argv: list[str] | None):
    p = argparse.ArgumentParser(prog=command_name("stories.demo"), description=__doc__.splitlines()[0])
    p.add_argument(
        "--events",
        type=int,
        default=env_int("DEMO_EVENTS", 200_000),
        help="records of the history (DEMO_EVENTS, 200000)",
    )
    p.add_argument(
        "--users",
        type=int,
        default=env_int("DEMO_USERS", 0) or None,
        help="simulated users (DEMO_USERS; default: the generator's, 1000)",
    )
    p.add_argument(
        "--live-seconds",
        type=int,
        default=env_int("DEMO_LIVE_SECONDS", 30),
        help="seconds of the live, real-time part (DEMO_LIVE_SECONDS, 30; 0: none)",
    )
    p.add_argument(
        "--events-per-user-s",
        type=float,
        default=EVENTS_PER_USER_S,
        help=f"the world's pace, events per user per second of event time ({EVENTS_PER_USER_S})",
    )
    p.add_argument(
        "--no-airflow", action="store_true", help="call verify/quality directly, not via `airflow dags test`"
    )
    p.add_argument(
        "--no-quality",
        action="store_true",
        help="skip the data-quality step (the summary says skipped; the exit status is verify's)",
    )
    p.add_argument("--catch-up-timeout", type=float, default=900)
    return p.parse_args(argv)


class DeliveryFailed(Exception):
    """Records the broker did not acknowledge (already printed): the demo exits 1."""


def start_speed_layer(settings: Settings) -> subprocess.Popen | None:
    """A speed layer in catch-up mode (``--available-now``) when the stack runs none; else None."""
    if has_speed_layer_service():
        return None
    print("  (the stack runs no speed layer: running one in catch-up mode, --available-now)")
    env = {**os.environ, "SOCIAL_VAR_DIR": str(settings.var_dir)}
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines.speed_layer", "--available-now"],
        cwd=REPO_ROOT,
        env=env,
        stdout=(Path(settings.log_dir) / "speed_layer-demo.log").open("ab"),
        stderr=subprocess.STDOUT,
    )


@dataclass
class History:
    """The history the demo appended (on the simulated clock), and when the serving path had it."""

    config: GeneratorConfig
    now_ms: int  # the wall clock it ends just before
    summary: Summary  # the generator's
    events: int  # records appended to the log (the generator's, as the log counts them)
    started: float  # monotonic: its first append
    serving_s: float  # from its first append until the fences covered it
    archive_watch: ArchiveWatch  # when the Delta views covered it


def append_history(args, settings: Settings, ns: str, proc: subprocess.Popen | None) -> History:
    """The history, written as fast as Kafka takes it, then folded into Redis (its fences)."""
    from app_sim.generator import produce
    from infra.stack import end_offsets

    topic = settings.events_topic
    now_ms = time.time_ns() // 1_000_000
    config = history_config(args.users, args.events, args.events_per_user_s, now_ms)
    say(
        f"appending the history: {args.events:,} events of {config.users:,} users to {topic} "
        f"(0.5% invalid, 0.5% duplicates), event time {_ms(config.start_ms)} -> about now"
    )
    before = end_offsets(settings, topic)
    t_history = time.monotonic()
    gen = produce(args.events, config, topic=topic, bootstrap=settings, progress=True)
    print(f"  {gen.events:,} events in {gen.seconds:.1f}s = {gen.events_per_s:,.0f} events/s")
    if gen.delivery_failures:
        print(f"  {gen.delivery_failures} delivery failures")
        raise DeliveryFailed
    history_end = end_offsets(settings, topic)
    history_n = covered(history_end, history_end) - covered(before, history_end)

    say("the serving path folds the history into Redis (its fences)")
    archive_watch = ArchiveWatch(settings, ns, history_end)
    hist_wait = wait_caught_up(settings, ns, history_end, ("serving",), args.catch_up_timeout, proc)
    return History(
        config=config,
        now_ms=now_ms,
        summary=gen,
        events=history_n,
        started=t_history,
        serving_s=hist_wait.reached["serving"] - t_history,
        archive_watch=archive_watch,
    )


def append_live(args, settings: Settings, history: History) -> Paced | None:
    """The live part: the same world in real time, at its own pace (None: ``--live-seconds 0``)."""
    from app_sim.generator import GeneratorConfig

    if args.live_seconds <= 0:
        return None
    config = history.config
    rate = max(1.0, config.users * args.events_per_user_s)
    n_live = max(1, round(rate * args.live_seconds))
    say(f"the live part: {n_live:,} events in real time at {rate:,.0f} events/s (the world's pace)")
    live_config = GeneratorConfig(
        users=config.users,
        seed=config.seed + 1,
        graph_seed=config.seed,  # the history's follower graph; no registrations again
        emit_bootstrap=False,
        invalid_share=0.005,
        duplicate_share=0.005,
        realtime=True,
        # a writer of its own (produce_paced claims its worker id): the history's writer going on
        # would count its event ids from 1 again, below the history's, every one a duplicate
    )
    live = produce_paced(n_live, live_config, rate, topic=settings.events_topic, bootstrap=settings)
    print(f"  {live.events:,} events in {live.seconds:.1f}s")
    if live.delivery_failures:
        print(f"  {live.delivery_failures} delivery failures")
        raise DeliveryFailed
    return live


def inject_patterns(settings: Settings) -> int:
    """The alert patterns by user 1, when the stack runs the analytics; the events injected."""
    if not settings.analytics:
        return 0
    from app_sim.generator import PATTERNS, inject

    say("injecting the alert patterns (burst, follow churn, message flood) by user 1")
    injected = inject(list(PATTERNS), topic=settings.events_topic, bootstrap=settings, user=1)
    print(f"  {injected} events")
    return injected


def analytics_outputs(settings: Settings) -> tuple[dict[str, dict[str, int]], str | None]:
    """The injected alerts on the alerts topic, and the analytics page (its path; None: not
    written), when the stack runs the analytics."""
    if not settings.analytics:
        return {}, None
    say("stream analytics: the injected alerts on social.alerts, and the analytics page")
    alerts = analytics_alerts(settings, 1, timeout_s=300)
    env = {**os.environ, "SOCIAL_VAR_DIR": str(settings.var_dir)}
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.analytics.report", "--injected-user", "1"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    page = done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else None
    if page is None:
        print(f"  the analytics page failed:\n{done.stderr[-2000:]}")
    return alerts, page


@dataclass
class Outcome:
    """What the summary reports: what was appended, when each path covered it, the checks."""

    history: History
    live: Paced | None
    injected: int
    serving_s: float  # the last event -> the fences at the log's end
    archive_s: float  # the last event -> the Delta views at the log's end
    archive_history_s: float  # the history's first append -> archived and compacted
    fresh: dict  # the serving path's freshness over the live and injected events
    verified: bool
    verify_s: float
    quality_ok: bool | None  # None: skipped (--no-quality)
    quality_s: float
    alerts: dict[str, dict[str, int]] = field(default_factory=dict)
    page: str | None = None
    report: dict = field(default_factory=dict)  # verify's latest.json

    @property
    def verify_ok(self) -> bool:
        return bool(self.verified and self.report.get("ok"))

    @property
    def injected_duplicates(self) -> int:
        return self.history.summary.duplicates + (self.live.duplicates if self.live else 0)

    @property
    def accounting(self) -> dict:
        """Verify's accounting: the keyed state's, which counts rejected records apart from
        quarantined ones (the Delta archive's counts both as quarantined), else the archive's."""
        return (self.report.get("keyed") or {}).get("accounting") or self.report.get("accounting", {})

    @property
    def duplicates_as_injected(self) -> bool:
        """The speed layer counted exactly the duplicates the demo injected: none of its other
        events was taken for one, and none of the re-sends was applied."""
        return self.accounting.get("duplicates") == self.injected_duplicates


def alerts_line(settings: Settings, alerts: dict[str, dict[str, int]]) -> str:
    """The summary's "alerts fired": per rule, the injected user's alerts and everyone else's."""
    if not settings.analytics:
        return "analytics off (SOCIAL_ANALYTICS=0)"
    mine, others = alerts.get("injected", {}), alerts.get("others", {})
    text = ", ".join(f"{r} {n}" for r, n in mine.items()) or "none yet (see var/log/analytics.log)"
    rest = ", ".join(f"{r} {n}" for r, n in others.items()) or "none"
    return f"injected user 1: {text}; all other users: {rest}"


def summary_rows(args, settings: Settings, o: Outcome, t0: float) -> list[tuple[str, str]]:
    """The summary's lines (:data:`SUMMARY`, in order), from what the run measured."""
    reports = Path(settings.reports_dir)
    verify_json = reports / "verify" / "latest.json"
    views = o.report.get("views", {})
    acct = o.accounting
    found = mismatches(o.report)
    h, fresh = o.history, o.fresh
    live_n = o.live.events if o.live else 0
    all_n = h.events + live_n + o.injected

    return [
        (
            "events appended",
            f"{all_n:,}: history {h.events:,} at {h.summary.events_per_s:,.0f} events/s, live {live_n:,} "
            f"({args.live_seconds}s in real time), injected {o.injected}",
        ),
        (
            "event time",
            f"history {_ms(h.config.start_ms)} -> {_ms(h.now_ms)} on the simulated clock "
            f"({h.config.users:,} users, {args.events_per_user_s:g} events per user per second), "
            "then the live part and the injection on the wall clock",
        ),
        (
            "serving path",
            f"Redis fences at the log's end {o.serving_s:.1f}s after the last event; the history "
            f"({h.events:,} events) applied {h.serving_s:.0f}s after its first append = "
            f"{_rate(h.events, h.serving_s)}",
        ),
        (
            "archive",
            f"Delta views at the log's end {o.archive_s:.1f}s after the last event; "
            f"the history archived and compacted {o.archive_history_s:.0f}s after its first append = "
            f"{_rate(h.events, o.archive_history_s)}",
        ),
        (
            "freshness (serving)",
            (
                f"p50 {fresh['p50_ms']} ms / p99 {fresh['p99_ms']} ms / max {fresh['max_ms']} ms, received -> "
                f"visible in Redis, over the {fresh['events']:,} live and injected events"
            )
            if fresh["events"]
            else "not measured: no event arrived in real time (--live-seconds 0 and no injection)",
        ),
        (
            "archive lag",
            f"the Delta views covered the log {o.archive_s - o.serving_s:.1f}s after Redis did "
            "(archive every SOCIAL_ARCHIVE_INTERVAL_S while records flow, at once when idle)",
        ),
        (
            "rows verified",
            f"{sum(v.get('recomputed_rows', 0) for v in views.values()):,} in {len(views)} views ({o.verify_s:.0f}s)",
        ),
        (
            "mismatches",
            f"{sum(n or 0 for n in found.values())} ("
            + ", ".join(f"{k} {'skipped' if n is None else n}" for k, n in found.items())
            + f") -> verify {'OK' if o.verify_ok else 'FAILED'}",
        ),
        (
            "accounting",
            f"read {acct.get('events_read', '-')} = applied {acct.get('applied', '-')} + duplicates "
            f"{acct.get('duplicates', '-')} + rejected {acct.get('rejected', '-')} + quarantined "
            f"{acct.get('quarantined', '-')} (the speed layer's, in Redis; duplicates injected "
            f"{o.injected_duplicates:,}) -> "
            f"{'ok' if acct.get('ok') and o.duplicates_as_injected else 'MISMATCH'}",
        ),
        (
            "data quality",
            "skipped (--no-quality)"
            if o.quality_ok is None
            else f"{'OK' if o.quality_ok else 'FAILED'} ({o.quality_s:.0f}s)",
        ),
        ("alerts fired", alerts_line(settings, o.alerts)),
        ("analytics page", o.page or ("-" if not settings.analytics else "not written")),
        ("analytics rows", analytics_rows(reports) if o.page else "-"),
        ("verify report", f"{verify_json} (+ latest.html)"),
        ("quality Data Docs", str(reports / "quality" / "index.html")),
        ("every report", str(write_index(settings))),
        ("total", f"{time.monotonic() - t0:.0f}s"),
    ]


def write_summary(settings: Settings, rows: list[tuple[str, str]], o: Outcome) -> None:
    """``var/reports/demo/summary.json``: the summary's lines and the figures a test checks."""
    out = Path(settings.reports_dir) / "demo"
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(
        json.dumps(
            {
                "summary": dict(rows),
                "verify_ok": o.verify_ok,
                "quality_ok": o.quality_ok,
                "duplicates_as_injected": o.duplicates_as_injected,
                "mismatches": mismatches(o.report),
                "serving_caught_up_s": round(o.serving_s, 2),
                "archive_caught_up_s": round(o.archive_s, 2),
                "freshness": o.fresh,
                "alerts": o.alerts,
            },
            indent=2,
        )
        + "\n"
    )


def look_around(settings: Settings, ns: str) -> None:
    """Where to look next, and how to stop."""
    say("look around")
    redis_cli = f"redis-cli -p {settings.redis_port}"
    hints = [
        ("make status", "what runs, pids, ports, logs; both lags, accounting, freshness"),
        ("python -m pipelines.metrics", "Prometheus metrics on 127.0.0.1:9464/metrics (docs/metrics.md)"),
        (f"{redis_cli} get active_namespace", "the live views version"),
        (
            (f"{redis_cli} get '{ns}:{{0}}:fence'", "the next offset partition 0's state applies (its fence)")
            if settings.serving_layout == "partitioned"
            else (f"{redis_cli} hgetall {ns}:fence", "the log position the keyed state covers (its fences)")
        ),
        (f"curl -s '127.0.0.1:{settings.api_port}/v1/health'", "the API"),
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = get_settings()
    t0 = time.monotonic()

    from contract import namespaces
    from infra.stack import Stack, end_offsets
    from pipelines.speed.processor import FRESHNESS_BUCKET_MS

    say("starting the stack (make up)")
    for name, outcome in Stack(settings).up().items():
        print(f"  {name:<12} {outcome}")
    ns = namespaces.active(settings)

    proc = start_speed_layer(settings)
    try:
        history = append_history(args, settings, ns, proc)
        fresh_before = freshness_histogram(settings, ns)
        live = append_live(args, settings, history)
        injected = inject_patterns(settings)
        t_last = time.monotonic()

        say("waiting for the serving path (fences in Redis) and the archive (Delta views) to cover the log")
        end = end_offsets(settings, settings.events_topic)
        final = wait_caught_up(
            settings, ns, end, ("serving", "archived", "archive"), args.catch_up_timeout, proc
        )
        if proc is not None:
            proc.wait(timeout=300)
    except DeliveryFailed:
        return 1
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)
    serving_s = final.reached["serving"] - t_last
    archive_s = final.reached["archive"] - t_last
    archive_history_s = (history.archive_watch.stop() or final.reached["archive"]) - history.started
    fresh = percentiles(histogram_since(freshness_histogram(settings, ns), fresh_before), FRESHNESS_BUCKET_MS)
    print(f"  serving path {serving_s:.0f}s, archive {archive_s:.0f}s after the last event was acknowledged")

    via = "airflow dags test" if not args.no_airflow else "python -m"
    say(f"verify_views ({via}): live views vs. a replay of the log")
    verified, verify_s = run_job("verify_views", "pipelines.verify", settings, not args.no_airflow)
    quality_ok: bool | None = None
    quality_s = 0.0
    if args.no_quality:
        say("data_quality: skipped (--no-quality)")
    else:
        say(f"data_quality ({via}): Great Expectations suites")
        quality_ok, quality_s = run_job("data_quality", "pipelines.quality", settings, not args.no_airflow)
    alerts, page = analytics_outputs(settings)

    verify_json = Path(settings.reports_dir) / "verify" / "latest.json"
    outcome = Outcome(
        history=history,
        live=live,
        injected=injected,
        serving_s=serving_s,
        archive_s=archive_s,
        archive_history_s=archive_history_s,
        fresh=fresh,
        verified=verified,
        verify_s=verify_s,
        quality_ok=quality_ok,
        quality_s=quality_s,
        alerts=alerts,
        page=page,
        report=json.loads(verify_json.read_text()) if verify_json.exists() else {},
    )
    say("summary")
    rows = summary_rows(args, settings, outcome, t0)
    assert tuple(k for k, _ in rows) == SUMMARY
    for k, v in rows:
        print(f"  {k:<22} {v}")
    write_summary(settings, rows, outcome)
    look_around(settings, ns)
    return 0 if outcome.verify_ok and quality_ok is not False and outcome.duplicates_as_injected else 1


if __name__ == "__main__":
    sys.exit(run_main(main, "stories.demo"))
