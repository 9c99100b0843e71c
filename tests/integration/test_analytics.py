"""The analytics through the real stack: Kafka -> ``python -m pipelines.analytics`` -> Delta + Kafka.

One bounded run of the stack's Analytics service (started, and found ready by its Spark UI REST
API, as ``make up`` does): generated traffic (server clock = wall clock, no offline devices so nothing is
late by design) plus the three alert patterns injected by a user the traffic never uses; the
alerts reach ``social.alerts`` and the ``alerts`` table; the report page is written. Then the
replay: the same queries over the retained log with ``--available-now`` and a fresh checkpoint
(another namespace, other micro-batches) give the same rows for every window the live run closed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from app_sim.generator import GeneratorConfig, inject, produce
from tests.integration.verifying import worker_spark

pytestmark = pytest.mark.integration
PATTERN_USER = 900_000
WINDOWED = ("activity_per_minute",)  # sessions close 5 min after their last event: unit-tested
LIVE = (*WINDOWED, "burst", "follow_churn", "message_flood")


def analytics(settings, topic: str, namespace: str, log_path, *args: str) -> subprocess.Popen:
    """``python -m pipelines.analytics`` in the foreground, with this test's topic and namespace."""
    from infra.stack import settings_env

    cmd = [sys.executable, "-m", "pipelines.analytics", "--topic", topic, "--namespace", namespace, *args]
    return subprocess.Popen(
        cmd,
        env=settings_env(settings),
        stdout=log_path.open("ab"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def analytics_service(settings, topic: str, namespace: str):
    """The stack's Analytics service as ``make up`` starts it (Spark UI port, pid file, log,
    ready when its driver answers on the Spark UI REST API), on this test's topic and namespace,
    running this test's queries."""
    from infra.stack import Analytics

    class TestAnalytics(Analytics):
        def command(self) -> list[str]:
            only = [a for q in LIVE for a in ("--only", q)]
            return [*super().command(), "--topic", topic, "--namespace", namespace, *only]

    return TestAnalytics(replace(settings, analytics=1))


def stop(service, timeout_s: float = 120) -> int:
    """SIGTERM, as ``make down`` stops it (the driver stops its queries); its exit code."""
    pid = service.pid()
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)  # the service's process is this test's child
        except ChildProcessError:  # reaped by a liveness check: it had exited before the stop
            raise AssertionError(f"the analytics exited early; see {service.log_file}") from None
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    raise AssertionError(f"the analytics did not stop in {timeout_s} s; see {service.log_file}")


def consume_alerts(settings, topic: str, want: set[str], timeout: float = 240) -> dict[str, dict]:
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": f"t-{topic}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    seen: dict[str, dict] = {}
    deadline = time.monotonic() + timeout
    try:
        while not want <= {a["rule"] for a in seen.values() if a["user_id"] == PATTERN_USER}:
            assert time.monotonic() < deadline, f"alerts seen: {sorted(seen)}"
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                seen[msg.key().decode()] = json.loads(msg.value())
    finally:
        consumer.close()
    return seen


def wait_for_rows(table_dir: Path, service, timeout: float = 300) -> None:
    """Until the Delta table has a commit that adds data (a window was closed and written)."""
    deadline = time.monotonic() + timeout
    while not any('"add"' in f.read_text() for f in table_dir.glob("_delta_log/*.json")):
        assert service.is_running() and time.monotonic() < deadline, service.log_file.read_text()[-4000:]
        time.sleep(1)


def wait_for_alert_rows(spark, table: str, alert_ids: set[str], service, timeout: float = 180) -> None:
    """Until the alerts table holds every one of these alerts."""
    deadline = time.monotonic() + timeout
    while not alert_ids <= {r["alert_id"] for r in spark.read.format("delta").load(table).collect()}:
        assert service.is_running() and time.monotonic() < deadline, service.log_file.read_text()[-4000:]
        time.sleep(2)


def test_live_alerts_report_and_replay(kafka_stack, topic_factory, tmp_path):
    from pipelines.analytics import report
    from pipelines.analytics.runner import Paths

    topic, alerts_topic = topic_factory(4), topic_factory(1)
    settings = replace(
        kafka_stack.settings,
        analytics_lateness_s=5,
        # a query's micro-batch costs about the same whatever it holds: at 3 s they ran back
        # to back (alone, 216 CPU-s for the test), at 10 s 137 CPU-s in the same ~128 s
        analytics_trigger_interval="10 seconds",
        alerts_topic=alerts_topic,
        var_dir=tmp_path / "var",
        # behind the serving path, as in the stack (10 there; the integration run sets 0 for the
        # archivers the other tests wait on): 5 shows the service applies the setting
        off_path_nice=5,
    )
    cfg = GeneratorConfig(users=100, mean_followers=3, seed=4, offline_share=0.0, realtime=True)
    live = analytics_service(settings, topic, "live")
    assert live.start() == "started"  # ready: its Spark driver answers on the Spark UI REST API
    live_log = live.log_file
    # off the serving path: the speed layer (this test process's priority) wins the cores
    assert os.getpriority(os.PRIO_PROCESS, live.pid()) == os.getpriority(os.PRIO_PROCESS, 0) + 5
    try:
        # ~80 s of event time at 50 events/s: the watermark (5 s behind) closes a minute or more
        produce(1_500, cfg, topic=topic, bootstrap=settings.kafka_bootstrap, rate=50, progress=False)
        inject(
            ["burst", "follow_churn", "message_flood"],
            topic=topic,
            bootstrap=settings.kafka_bootstrap,
            user=PATTERN_USER,
            settings=settings,
        )
        more = replace(cfg, seed=5)
        produce(2_500, more, topic=topic, bootstrap=settings.kafka_bootstrap, rate=50, progress=False)
        seen = consume_alerts(settings, alerts_topic, {"burst", "follow_churn", "message_flood"})
        wait_for_rows(Path(Paths.for_namespace(settings, "live").table("activity_per_minute")), live)
        spark = worker_spark(settings)  # this worker's session, for reading what the service wrote
        # an alert reaches Kafka before Delta: stopped in between, its batch would only be re-run
        # (and the table written) at the next start
        wait_for_alert_rows(spark, Paths.for_namespace(settings, "live").table("alerts"), set(seen), live)
    finally:
        code = stop(live)
    assert code == 0, live_log.read_text()[-4000:]

    # every query's finished micro-batches, one JSON line each, for people and the benchmark
    from pipelines.analytics.runner import EVENTS, ProgressLog

    progress = [json.loads(x) for x in ProgressLog.path_for(settings, "live").read_text().splitlines()]
    assert {p["name"] for p in progress} == {f"analytics_{q}" for q in (EVENTS, *LIVE)}
    # the log is read and parsed once, by the events query; the outputs stream from its table
    for p in progress:
        source = p["sources"][0]["description"]
        assert source.startswith(
            "KafkaV2[Subscribe[" if p["name"] == f"analytics_{EVENTS}" else "DeltaSource["
        )

    mine = {k: a for k, a in seen.items() if a["user_id"] == PATTERN_USER}
    assert {a["rule"] for a in mine.values()} == {"burst", "follow_churn", "message_flood"}
    assert all(a["value"] > a["threshold"] for a in mine.values() if a["rule"] == "burst")
    churn = next(a for a in mine.values() if a["rule"] == "follow_churn")
    assert churn["value"] == settings.rule_churn_repeats + 1 and len(churn["event_ids"]) == 2 * churn["value"]
    flood = next(a for a in mine.values() if a["rule"] == "message_flood")
    assert flood["value"] == settings.rule_flood_recipients + 2

    replay_log = tmp_path / "replay.log"
    only = [a for q in WINDOWED for a in ("--only", q)]
    replay = analytics(settings, topic, "replay", replay_log, "--available-now", *only)
    assert replay.wait(timeout=600) == 0, replay_log.read_text()[-4000:]

    live_paths, replay_paths = (
        Paths.for_namespace(settings, "live"),
        Paths.for_namespace(settings, "replay"),
    )
    alerts = spark.read.format("delta").load(live_paths.table("alerts"))
    assert set(mine) <= {r["alert_id"] for r in alerts.collect()}  # the table has what the topic got
    for name, end in (("activity_per_minute", "window_end"),):
        got = spark.read.format("delta").load(live_paths.table(name))
        again = spark.read.format("delta").load(replay_paths.table(name))
        assert got.count() > 0, name
        closed = got.agg({end: "max"}).first()[0]
        # every window the live run closed, the replay closed with the same rows
        assert sorted(map(tuple, got.collect())) == sorted(
            map(tuple, again.where(again[end] <= closed).collect())
        )
    page = report.write(spark, settings, "live")
    text = page.read_text()  # the queries this run had: activity and alerts (two plots)
    assert "Activity per minute" in text and "Alerts over time" in text and text.count("<img") == 2
    summary = json.loads((page.parent / "summary.json").read_text())
    assert summary["alerts_per_rule"]["follow_churn"] >= 1
