"""Faults of the keyed speed layer, each through the real stack, each ending with verify.

- Redis killed with SIGKILL mid-run and restarted from its append-only file: its fences roll back
  with its state (at most the last second of writes is lost), the speed layer starts from those
  fences and re-applies the log from there; the keyed state then equals its replay and the
  accounting is exact.
- One archived position P (a live namespace whose Delta views cover P, more events after P in the
  log), two ways back from it in one test (they share that slow part):
  - a new namespace rebuilt from the batch layer (``rebuild_views`` with ``source=batch``): the
    batch views at P seed its Delta tables and Redis, its speed layer reads only the log after P,
    and the whole rebuild verifies against a replay of the whole log;
  - Redis emptied entirely (FLUSHALL): restored from the Delta views and archive at P
    (``python -m pipelines.restore``), then the speed layer reads only the log after it; the
    keyed state then equals a replay of the whole log.
- The broker restarted mid-run: the speed layer and the archiver ride it out.

(The speed layer and the archiver killed with SIGKILL at random moments, ten times each, is in
test_speed_layer.py, with the Delta side verified too.)

The one-off Spark jobs (``verify --keyed-only``, the rebuild) run in this pytest worker's own
Spark session (tests/integration/verifying.py); ``python -m pipelines.restore`` runs as a command.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from app_sim.generator import GeneratorConfig, produce
from tests.integration.verifying import assert_keyed_ok, verify_keyed, worker_spark

pytestmark = pytest.mark.integration


def test_redis_kill9_and_restart_from_its_aof(kafka_stack, topic_factory, speed_layer_factory, tmp_path):
    settings, store = _private_redis(kafka_stack, tmp_path)
    store.start()
    try:
        topic = topic_factory(4)
        cfg = GeneratorConfig(users=300, seed=8, mean_followers=10, invalid_share=0.02, duplicate_share=0.02)
        summary = produce(30_000, cfg, topic=topic, bootstrap=kafka_stack.bootstrap, progress=False)
        sl = speed_layer_factory(
            topic=topic,
            namespace="redis_crash",
            archive=False,
            max_offsets_per_trigger=2_000,
            **{k: getattr(settings, k) for k in ("redis_port", "redis_url", "var_dir")},
        )
        sl.wait_applied(8_000, timeout=300)  # well into the log, mid-run
        pid = store.pid()
        os.kill(pid, signal.SIGKILL)
        while store.is_running():
            time.sleep(0.05)
        assert store.start() == "started"  # from the append-only file
        recovered = sum(sl.redis_position().values())
        assert 0 < recovered < summary.events
        # the speed layer lost its store: it stops loudly (an infrastructure failure) or is killed
        sl.kill9()
        sl.restart()
        sl.wait_caught_up(timeout=600)
        sl.stop()
        k = verify_keyed(settings, topic, "redis_crash")
        assert_keyed_ok(k, summary)
    finally:
        store.stop()


def records_read_since_start(sl) -> int:
    """Records the speed layer's micro-batches read since its last start (its progress lines)."""
    since_start = sl.log_path.read_text().split("speed layer running")[-1]
    return sum(
        int(line.split("'records': ")[1].split(",")[0])
        for line in since_start.splitlines()
        if "keyed batch" in line
    )


def _private_redis(kafka_stack, tmp_path):
    from infra.stack import RedisServer
    from tests.conftest import _free_port

    port = _free_port(16479, {kafka_stack.settings.redis_port})
    settings = dataclasses.replace(
        kafka_stack.settings,
        redis_port=port,
        redis_url=f"redis://127.0.0.1:{port}/0",
        var_dir=tmp_path / "var",
    )
    return settings, RedisServer(settings)


# The suite's longest test: a live namespace archived, a rebuild (batch layer, seed, speed layer,
# archiver, a whole verify), a restore and a keyed verify, beside the other worker and the unit
# run. It took 417-534 s on a fast day and 863 s on a slow one (2026-11-27): the suite-wide 900 s
# is a hang guard, and this test's is 1,500 s.
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("layout", ["keyed", "partitioned"])
def test_rebuild_from_the_batch_layer_then_flushall_and_restore_read_only_the_log_after_p(
    kafka_stack, topic_factory, speed_layer_factory, tmp_path, layout
):
    """One archived position P, two ways back from it (they share the slow part: a live namespace
    run until its Delta views cover P, then more events after P in the log):

    1. a new namespace rebuilt from the batch layer's views at P (``rebuild_views`` with
       ``source=batch``) reads only the log after P, and verifies against a replay of the whole log;
    2. Redis emptied entirely (FLUSHALL), restored from the live namespace's Delta views at P
       (``python -m pipelines.restore``): its fences are P again, and the restarted speed layer
       reads only the log after P; the keyed state then equals a replay of the whole log.
    """
    import redis

    from infra.stack import settings_env
    from pipelines.archiver import archived
    from pipelines.batch_layer.job import batch_position
    from pipelines.lake import committed_position
    from pipelines.rebuild import rebuild

    settings, store = _private_redis(kafka_stack, tmp_path)
    store.start()
    try:
        topic = topic_factory(4)
        cfg = GeneratorConfig(
            users=300, seed=21, graph_seed=21, mean_followers=10, invalid_share=0.02, duplicate_share=0.02
        )
        first = produce(12_000, cfg, topic=topic, bootstrap=kafka_stack.bootstrap, progress=False)
        private = {k: getattr(settings, k) for k in ("redis_port", "redis_url", "var_dir")}
        live = speed_layer_factory(
            topic=topic, namespace="live", views_namespace="live", serving_layout=layout, **private
        )
        archived_at = live.wait_caught_up(timeout=600)  # Redis and the compacted Delta views: P
        live.stop()
        # more events after P: both ways back read these from the log (the same users and graph;
        # the run allocates another worker id from the log's registry: post and message ids stay unique)
        cfg2 = dataclasses.replace(cfg, seed=22, emit_bootstrap=False)
        second = produce(3_000, cfg2, topic=topic, bootstrap=kafka_stack.bootstrap, progress=False)

        class Both:
            events = first.events + second.events
            duplicates = first.duplicates + second.duplicates
            invalid = {"all": sum(first.invalid.values()) + sum(second.invalid.values())}

        # 1. rebuilt from the batch layer at P: ``python -m pipelines.rebuild run --source batch
        # --namespace nb --no-switch``, in this worker's Spark session (the command's own process
        # is the rebuild_views DAG's, test_dags_e2e.py); it raises unless built, then verified
        # against a replay of the log
        worker_spark(live.settings)
        assert rebuild(live.settings, "nb", topic, do_switch=False, source="batch") == "nb"
        assert batch_position(live.settings.lake_dir, "nb-batch") == archived_at  # the batch views' P
        # the new namespace's changelog after the seed: the records after P, each once (its
        # sequence numbers count from the seed's 0); none of the log below P was applied again
        after_seed = archived(live.settings.lake_dir, "nb")
        assert after_seed.archive_id == 1 and after_seed.start_offsets == archived_at
        if layout == "keyed":  # (the partitioned layout has no global sequence)
            assert after_seed.seq == second.events
        assert sum(after_seed.end_offsets.values()) == Both.events
        assert committed_position(live.settings.lake_dir, "nb") == (1, after_seed.end_offsets)
        report = json.loads((live.settings.reports_dir / "verify" / "latest.json").read_text())
        assert report["namespace"] == "nb" and report["ok"] is True
        acct = report["keyed"]["accounting"]
        assert acct["events_read"] == Both.events
        assert acct["duplicates"] == Both.duplicates
        assert acct["rejected"] + acct["quarantined"] == sum(Both.invalid.values())

        # 2. Redis emptied, the live namespace restored from its Delta views at P
        client = redis.Redis.from_url(settings.redis_url)
        client.flushall()
        assert client.dbsize() == 0
        done = subprocess.run(
            [sys.executable, "-m", "pipelines.restore", "--namespace", "live"],
            env=settings_env(live.settings),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        assert live.redis_position() == archived_at  # the fences: the position the views covered
        # the keyed state alone from here (its verify reads the log and Redis, not Delta): no
        # archiver, whose Spark session would only cost the test time
        live.archive = False
        live.restart()
        live.wait_caught_up(timeout=600)
        # a batch's fences land with its effects, its progress line (what it read) just after
        deadline = time.monotonic() + 120
        while records_read_since_start(live) < second.events and time.monotonic() < deadline:
            time.sleep(0.5)
        live.stop()
        assert records_read_since_start(live) == second.events  # not the whole log again
        assert_keyed_ok(verify_keyed(live.settings, topic, "live"), Both)
    finally:
        store.stop()


def test_broker_restart_mid_run(kafka_stack, topic_factory, speed_layer_factory):
    from infra.stack import KafkaBroker

    topic = topic_factory(4)
    cfg = GeneratorConfig(users=300, seed=12, mean_followers=10, invalid_share=0.02, duplicate_share=0.02)
    summary = produce(20_000, cfg, topic=topic, bootstrap=kafka_stack.bootstrap, progress=False)
    # the keyed state only (its verify reads the log and Redis): no archiver, whose Spark session
    # and compaction would be most of the test's CPU and none of what it checks
    sl = speed_layer_factory(
        topic=topic, namespace="broker_restart", archive=False, max_offsets_per_trigger=1_000
    )
    sl.wait_applied(4_000, timeout=300)  # mid-run
    broker = KafkaBroker(kafka_stack.settings)
    assert broker.stop() == "stopped"
    time.sleep(3)
    assert broker.start() == "started"
    sl.wait_caught_up(timeout=600)
    sl.stop()
    assert_keyed_ok(verify_keyed(kafka_stack.settings, topic, "broker_restart"), summary)
