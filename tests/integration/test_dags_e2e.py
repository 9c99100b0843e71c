"""The DAGs against the real stack: a corrupted view row is caught by the quality suite and by
``verify_views``, and ``rebuild_views`` repairs it by blue/green reprocessing, verified; rollback
is one command.

One story in order (module-scoped state), because every step needs the previous one's lake:

1. a few thousand generated events -> the speed layer (catch-up mode) into namespace A, and the
   archiver once (its Delta archive and views);
2. one ``unread_counts`` row of A is changed through Delta (what a buggy writer or a dual write
   would do), and the next micro-batch (which touches another user) records it in A's table
   versions; the quality suite catches it, and ``verify_views`` (``dag.test()``) fails on that
   view alone, every other table of A still equal to its recomputation;
3. ``rebuild_views`` (namespace B): build from offset 0, verify, switch: B is
   live (file + Redis pointer) and verifies; A is kept;
4. ``python -m pipelines.rebuild rollback``: A is live again.

A passing verify is the rebuild's own step (3: the same ``verify`` over B, and the switch only
follows it); a separate ``verify_views`` run on the healthy A before the corruption, one more
Spark application (~50 CPU-seconds), checked nothing the two runs here do not.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from dataclasses import fields

import pytest

from infra.settings import REPO_ROOT, Settings, get_settings
from infra.stack import settings_env
from tests.integration.verifying import worker_spark

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def run_py(settings: Settings, args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO_ROOT,
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def speed_layer(settings: Settings, namespace: str, topic: str) -> None:
    """The speed layer up to the log's end (Redis), then the archiver once (the Delta archive and
    views), as a rebuild's build step runs them: one Spark application, this worker's own
    (tests/integration/verifying.py). What the DAGs run, they run as commands."""
    from pipelines.rebuild import catch_up

    worker_spark(settings)
    catch_up(settings, namespace, topic)


def dags_test(settings: Settings, dag_id: str, conf: dict) -> tuple[bool, str]:
    """One ``dag.test()`` run through ``python -m infra.airflow test``: its exit status is the verdict."""
    from infra.airflow import dags_test as run_dag

    done = run_dag(dag_id, settings, conf, timeout_s=900, capture=True, base_env=settings_env(settings))
    return done.returncode == 0, done.stdout + done.stderr


def produce_status_update(settings: Settings, topic: str, user_id: int) -> None:
    """One valid event touching only ``user_id`` (a new micro-batch that leaves other users alone)."""
    from confluent_kafka import Producer

    now = int(time.time() * 1000)
    event = {
        "event_id": str(uuid.uuid4()),
        "type": "status_updated",
        "schema_version": 1,
        "user_id": user_id,
        "device_time": now,
        "sent_time": now,
        "received_time": now,
        "text": "back from lunch",
    }
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    producer.produce(topic, json.dumps(event).encode(), str(user_id).encode())
    assert producer.flush(30) == 0


@pytest.fixture(scope="module")
def story(kafka_stack, tmp_path_factory):
    """Settings on the session stack with a private var dir, a topic with events, namespace A built."""
    from app_sim.generator import GeneratorConfig, produce
    from contract import namespaces
    from contract.serving import connect
    from infra.stack import create_topic, delete_topic

    suffix = uuid.uuid4().hex[:6]
    settings = get_settings(
        **{f.name: getattr(kafka_stack.settings, f.name) for f in fields(Settings) if f.name != "var_dir"},
        var_dir=tmp_path_factory.mktemp("dags-var"),
    )
    topic = f"test.dags.{suffix}"
    create_topic(settings, topic, 4)
    redis = connect(settings.redis_url)
    saved_pointer = redis.get(namespaces.REDIS_KEY)
    produce(
        4000,
        GeneratorConfig(users=60, mean_followers=8, invalid_share=0.01, duplicate_share=0.01, seed=7),
        topic=topic,
        bootstrap=settings.kafka_bootstrap,
        progress=False,
    )
    ns_a, ns_b = f"a{suffix}", f"b{suffix}"
    namespaces.switch(settings, ns_a)  # the file pointer only: the session's Redis pointer is restored below
    speed_layer(settings, ns_a, topic)
    yield {"settings": settings, "topic": topic, "a": ns_a, "b": ns_b, "redis": redis}
    for ns in (ns_a, ns_b):
        for key in redis.scan_iter(match=f"{ns}:*", count=1000):
            redis.unlink(key)
    if saved_pointer is None:
        redis.delete(namespaces.REDIS_KEY)
    else:
        redis.set(namespaces.REDIS_KEY, saved_pointer)
    try:
        delete_topic(settings, topic)
    except Exception:  # noqa: BLE001 - cleanup must not mask the test's outcome
        pass


def test_1_corrupted_row_is_caught_by_quality_and_verify(story, monkeypatch):
    s, ns, topic = story["settings"], story["a"], story["topic"]
    # In this worker's Spark session (the story's setup started it):
    # one unread_counts row of A is changed through Delta, then one event touching another user
    # (a status update) is appended to the log, then the speed layer and the archiver catch up
    # (as `speed_layer` above): the next micro-batch records table versions that include the
    # corrupted row, so the live views at P are wrong from then on.
    from pyspark.sql import functions as F

    from pipelines.rebuild import catch_up

    path = s.lake_dir / ns / "unread_counts"
    spark = worker_spark(s)
    users = spark.read.format("delta").load(str(s.lake_dir / ns / "users"))
    victim = spark.read.format("delta").load(str(path)).agg(F.min("user_id")).collect()[0][0]
    spark.sql(f"UPDATE delta.`{path}` SET unread = unread + 3 WHERE user_id = {victim}")
    bystander = users.where(F.col("user_id") != victim).agg(F.max("user_id")).collect()[0][0]
    produce_status_update(s, topic, user_id=bystander)
    catch_up(s, ns, topic)

    # the quality command's own entry point (its arguments, its exit status: 1 when a suite fails),
    # in this worker's Spark session with the story's settings in its environment, as the
    # data_quality DAG's task process gets them; as a process of its own it cost a cold JVM (31-33
    # CPU-s on a quiet machine, against ~10 in a warm session)
    from pipelines.quality import main as quality_main

    for name, value in settings_env(s).items():
        monkeypatch.setenv(name, value)
    args = ["--namespace", ns, "--suite", "unread_invariant", "--suite", "unread_counts"]
    assert quality_main(args) == 1
    summary = json.loads((s.reports_dir / "quality" / "latest.json").read_text())
    failed = {r["suite"] for r in summary["suites"] if not r["success"]}
    assert failed == {"unread_invariant"}
    assert (s.reports_dir / "quality" / "index.html").exists()

    ok, out = dags_test(s, "verify_views", {"topic": story["topic"]})
    assert not ok, out[-3000:]
    report = json.loads((s.reports_dir / "verify" / "latest.json").read_text())
    assert report["ok"] is False and report["namespace"] == ns
    assert report["views"]["unread_counts"]["mismatches"] >= 1
    # the corrupted row is the only disagreement: every other view of A still equals the replay
    assert {name for name, v in report["views"].items() if not v["ok"]} == {"unread_counts"}
    assert (s.reports_dir / "verify" / "latest.html").exists()


def test_2_rebuild_views_repairs_by_blue_green_switch(story):
    from contract import namespaces

    s = story["settings"]
    ok, out = dags_test(s, "rebuild_views", {"namespace": story["b"], "topic": story["topic"]})
    assert ok, out[-5000:]
    assert namespaces.active(s) == story["b"]
    assert story["redis"].get(namespaces.REDIS_KEY) == story["b"]
    report = json.loads((s.reports_dir / "verify" / "latest.json").read_text())
    assert report["namespace"] == story["b"] and report["ok"] is True
    assert (s.lake_dir / story["a"] / "batches").exists()  # the old version is kept for rollback


def test_3_rollback_is_one_command(story):
    from contract import namespaces

    s = story["settings"]
    done = run_py(s, ["-m", "pipelines.rebuild", "rollback", "--no-restart"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert namespaces.active(s) == story["a"]
    assert story["redis"].get(namespaces.REDIS_KEY) == story["a"]
