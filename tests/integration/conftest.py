"""Integration fixtures on top of the session stack: the speed layer as real subprocesses.

`speed_layer_factory(topic=..., namespace=..., archive=True, **settings)` starts
`python -m pipelines.speed_layer` and (with ``archive``) `python -m pipelines.archiver` against the
session's Kafka and Redis with their own namespace (Delta tables, checkpoint, Redis keys), exactly
as `make up` runs them, the archiver compacting every few seconds instead of every few minutes;
every one started is stopped at teardown.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from infra.settings import Settings


@dataclass
class SpeedLayerProcess:
    settings: Settings
    topic: str
    namespace: str
    log_path: Path
    args: tuple[str, ...] = ()
    archive: bool = True
    proc: subprocess.Popen | None = None
    archiver: subprocess.Popen | None = None
    restarts: int = field(default=0)

    def _spawn(self, module: str, log_path: Path, *args: str) -> subprocess.Popen:
        from infra.stack import settings_env

        with log_path.open("ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", module, "--topic", self.topic, "--namespace", self.namespace, *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=settings_env(self.settings),
                start_new_session=True,
            )

    @property
    def archiver_log(self) -> Path:
        return self.log_path.with_name(self.log_path.stem + "-archiver.log")

    def start(self) -> SpeedLayerProcess:
        self.proc = self._spawn("pipelines.speed_layer", self.log_path, *self.args)
        if self.archive and (self.archiver is None or self.archiver.poll() is not None):
            self.start_archiver()
        return self

    def start_archiver(self) -> None:
        self.archiver = self._spawn("pipelines.archiver", self.archiver_log)

    def kill9_archiver(self) -> None:
        _kill9(self.archiver)

    def store(self):
        from pipelines.serving import ServingStore, connect

        return ServingStore(connect(self.settings.redis_url), self.namespace)

    def lake_position(self) -> dict[int, int]:
        """The log position the Delta views cover."""
        from pipelines.lake import committed_position

        committed = committed_position(self.settings.lake_dir, self.namespace)
        return committed[1] if committed else {}

    def redis_position(self) -> dict[int, int]:
        """The log position the keyed state in Redis covers (its fences)."""
        return self.store().fences()

    def position(self) -> dict[int, int]:
        """Where both the keyed state and the Delta views are (the smaller offset per partition)."""
        if not self.archive:
            return self.redis_position()
        lake, keyed = self.lake_position(), self.redis_position()
        return {p: min(lake.get(p, 0), keyed.get(p, 0)) for p in set(lake) | set(keyed)}

    def wait_for(self, offsets: dict[int, int], timeout: float = 300.0) -> dict[int, int]:
        """Block until every partition's covered offset reaches ``offsets`` (exclusive end)."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(
                    f"speed layer exited with {self.proc.returncode}; see {self.log_path}:\n{self.tail()}"
                )
            if self.archiver is not None and self.archiver.poll() is not None:
                raise AssertionError(
                    f"archiver exited with {self.archiver.returncode}; see {self.archiver_log}:\n"
                    + self.tail(path=self.archiver_log)
                )
            got = self.position()
            if all(got.get(int(p), 0) >= o for p, o in offsets.items()):
                return got
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"speed layer at {got}, wanted {offsets}; see {self.log_path}:\n{self.tail()}"
                )
            time.sleep(0.5)

    def wait_caught_up(self, timeout: float = 300.0) -> dict[int, int]:
        from infra.stack import end_offsets

        return self.wait_for(end_offsets(self.settings, self.topic), timeout)

    def wait_running(self, timeout: float = 180.0) -> None:
        """Block until the current process has its streaming query running (JVM up, query started)."""
        deadline = time.monotonic() + timeout
        while self.log_path.read_bytes().count(b"speed layer running") < self.restarts + 1:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"speed layer did not start; see {self.log_path}:\n{self.tail()}")
            time.sleep(0.2)

    def restart(self) -> None:
        self.restarts += 1
        self.start()

    def kill9(self) -> None:
        """Crash the speed layer: SIGKILL to its whole process group (the Python driver and its JVM)."""
        _kill9(self.proc)

    def stop(self) -> None:
        for proc in (self.proc, self.archiver):
            if proc is None or proc.poll() is not None:
                continue
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                _kill9(proc)

    def tail(self, lines: int = 40, path: Path | None = None) -> str:
        try:
            text = (path or self.log_path).read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(line for line in text if "WARN" not in line)[-4000:] if text else ""


def _kill9(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# The archiver as the tests run it: archives every second, compacts every few seconds.
ARCHIVER_TEST_SETTINGS = {
    "archive_interval_s": 1.0,
    "archive_durability_s": 1.0,
    "compaction_interval_s": 3.0,
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
