"""Integration fixtures on top of the session stack: the speed layer as real subprocesses.

`speed_layer_factory(topic=..., namespace=..., archive=True, **settings)` starts
`python -m pipelines.speed_layer` and (with ``archive``) `python -m pipelines.archiver` against the
session's Kafka and Redis with their own namespace (Delta tables, checkpoint, Redis keys), exactly
as `make up` runs them, the archiver compacting when the log goes quiet (ARCHIVER_TEST_SETTINGS
below); every one started is stopped at teardown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from infra.speed_layer_process import SpeedLayerProcess

# `make test` spreads these files over two pytest-xdist workers, a file at a time (`--dist
# loadfile`: a file's tests share its fixtures and run in order), handing the next file to a worker
# when it has two tests or fewer left. xdist first sorts the files by their number of tests (its
# default `--loadscope-reorder`); this order, longest first by CI's durations, breaks the ties.
# Replayed with CI's per-test durations, xdist's order ends the two workers 24 s apart, the longest
# first alone (`--no-loadscope-reorder`) 102 s apart: the next file is handed out early, so the
# long files pair up on one worker.
LONGEST_FIRST = (
    "test_keyed_faults.py",
    "test_speed_layer.py",
    "test_dags_e2e.py",
    "test_analytics.py",
    "test_erasure_audit.py",
    "test_cluster_faults.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: order within a file kept


# The archiver as the tests run it: archives every second; compacts at once when the log goes
# quiet (the speed layer at the log's end, nothing new to archive: what every test waits for),
# and otherwise only every 5 minutes, longer than any test streams. A compaction costs 12-24
# CPU-seconds however few events it folds (~10 MERGEs). At a 30 s interval, and with a quiet
# log that did not ask where the speed layer was, the crash test compacted four times where the
# two it waits for cover it (its restarts make pauses, and the interval fell in the others).
ARCHIVER_TEST_SETTINGS = {
    "archive_interval_s": 1.0,
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
