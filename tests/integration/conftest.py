"""Integration fixtures on top of the session stack: the speed layer as real subprocesses.

`speed_layer_factory(topic=..., namespace=..., archive=True, **settings)` starts
`python -m pipelines.speed_layer` and (with ``archive``) `python -m pipelines.archiver` against the
session's Kafka and Redis with their own namespace (Delta tables, checkpoint, Redis keys), exactly
as `make up` runs them, the archiver compacting when the log goes quiet (ARCHIVER_TEST_SETTINGS
below); every one started is stopped at teardown.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from pipelines.speed_layer_process import SpeedLayerProcess

# `make test` spreads these files over two pytest-xdist workers, a file at a time (`--dist
# loadfile`: a file's tests share its fixtures and run in order), handing the next file to a worker
# when it has two tests or fewer left. The files go out longest first, by their seconds in a whole
# run below (the sum of their tests' times in `make test`, 2026-11-27 14:09; a file not listed is
# short and goes last, in name order), and xdist keeps that order (`--no-loadscope-reorder` in the
# Makefile; its default sorts the files by their number of tests, whatever they take).
# Replayed with that run's per-test times and xdist's rule for handing out files, each file's time
# scaled by a random +-15% (80 draws): the two workers are done after 1,063 s on average, 1,096 s
# with xdist's order (that run: 1,124 s, the workers 174 s apart); with the times of the run before
# (stream == replay still ran an archiver), 1,224 against 1,255.
FILE_SECONDS = {
    "test_keyed_faults.py": 520,
    # new on 2026-11-28 (the demo, the property test, verify on a young stack): their times measured
    # alone on a loaded machine, scaled to the run's pace, until a whole run gives theirs
    "test_demo.py": 600,
    "test_properties.py": 150,
    "test_dags_e2e.py": 385,
    "test_speed_layer.py": 345,
    "test_analytics.py": 151,
    "test_erasure_audit.py": 139,
    "test_cluster_faults.py": 132,
    "test_dual_write.py": 88,
    "test_api.py": 80,
    "test_verify_young.py": 150,
    # new on 2026-12-06: a SASL/SCRAM and a mutual-TLS broker of its own, a Spark session, a stack, alone: 86 s
    "test_external_kafka.py": 86,
    # 2026-12-06 14:07 and 14:11, alone (another session's test file beside it): 198 and 199 s, of
    # which the small demo on external Kafka, Redis and an S3 lake 166 and 158 s (620 s before its size, its analytics and
    # its stack test were cut to fit CI's 5 minutes)
    # ... and it goes out first, whatever its time (FIRST below): its Spark session must be its
    # worker's first, since S3A's classes are on a driver's classpath only from the JVM's start
    "test_external_lake.py": 200,
    # new on 2026-12-06: measured alone (121 s on a quiet 2-core machine), most of it real time
    # (40 s under load, then the alert's `for` and scrapes); skipped without Debian's prometheus
    "test_alerts.py": 121,
    # new on 2026-12-06: a speed layer, archiver, API, exporter, Prometheus and headless Chromium, alone
    # at load 14 (other engineers' Spark runs): 72 s with its teardown
    "test_dashboard.py": 75,
    "test_stack.py": 56,
    "test_poison.py": 54,
    "test_api_hostile.py": 45,
    "test_airflow_ui.py": 74,  # 2026-12-06, alone: a second DAG run (report link, failure notice)
    # new on 2026-12-06: the stack's Redis Cluster under the stream, verify, restore, the API and a
    # master killed, a master replaced by its replica; alone, other tests beside it: 112 + 9 + 40 +
    # 40 s and the clusters' starts
    "test_redis_cluster_stack.py": 210,
    "test_compacted_topics.py": 21,
    "test_history.py": 12,
}


def pytest_configure(config: pytest.Config) -> None:
    # An xdist worker's ``__main__`` (execnet's ``python -c``) has neither a file nor a spec, which
    # pyspark.sql.connect's import takes for a doctest run and exits the process on
    # (pyspark/sql/connect/utils.py): Great Expectations imports it, so a test running the quality
    # suites in its worker would end the worker. The worker's ``__main__`` gets a name.
    main = sys.modules["__main__"]
    if os.environ.get("PYTEST_XDIST_WORKER") and getattr(main, "__spec__", None) is None:
        if not hasattr(main, "__file__"):
            main.__file__ = "<pytest-xdist worker>"


# files whose in-process Spark session needs jars on the driver's classpath from the JVM's start:
# handed out before any other, so their worker has started no Spark session yet
FIRST = ("test_external_lake.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # stable: a file's tests keep their order, unlisted files their name order
    items.sort(key=lambda item: (item.path.name not in FIRST, -FILE_SECONDS.get(item.path.name, 0)))


# The archiver as the tests run it: archives at once when the speed layer is idle at the log's
# end (what every test waits for), and otherwise every minute, so the crash test still crashes it
# in archives made while the speed layer reads on; compacts at once when the log goes quiet (at its
# end, nothing new to archive), and otherwise only every 5 minutes, longer than any test streams.
# An archive costs ~8-20 CPU-seconds however few records it holds, a compaction 12-24 (~10
# MERGEs). Archiving every second, the crash test archived 12-13 times back to back; every 60 s
# and at once at the end, 7 (the test alone: archivers 253 -> 212 CPU-seconds, 655 -> 627 in all,
# 2026-11-28).
ARCHIVER_TEST_SETTINGS = {
    "archive_interval_s": 60.0,
    "archive_durability_s": 1.0,
    "compaction_interval_s": 300.0,
    "compacted_partitions": 1,  # the compacted topics each speed layer creates: few partitions
}


@pytest.fixture
def speed_layer_factory(kafka_stack, tmp_path: Path) -> Iterator[Callable[..., SpeedLayerProcess]]:
    started: list[SpeedLayerProcess] = []

    def make(
        topic: str, namespace: str, *, args: tuple[str, ...] = (), archive: bool = True, **overrides
    ) -> SpeedLayerProcess:
        settings = replace(kafka_stack.settings, **{**ARCHIVER_TEST_SETTINGS, **overrides})
        log_path = tmp_path / f"speed_layer-{namespace}.log"
        sl = SpeedLayerProcess(
            settings, topic, namespace, log_path, args=tuple(args), archive=archive
        ).start()
        started.append(sl)
        return sl

    yield make
    for sl in started:
        sl.stop()
