"""Integration fixtures on top of the session stack: the speed layer as a real subprocess.

`speed_layer_factory(topic=..., namespace=..., **settings)` starts `python -m pipelines.speed_layer`
against the session's Kafka and Redis with its own namespace (Delta tables, checkpoint, Redis
keys), exactly as `make up` runs it; every one started is stopped at teardown.
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
    proc: subprocess.Popen | None = None
    restarts: int = field(default=0)

    def start(self) -> SpeedLayerProcess:
        from infra.stack import settings_env

        env = settings_env(self.settings)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pipelines.speed_layer",
                    "--topic",
                    self.topic,
                    "--namespace",
                    self.namespace,
                    *self.args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        return self

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
        if "--no-views" in self.args:
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
        """Crash it: SIGKILL to the whole process group (the Python driver and its JVM)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill9()

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(line for line in text if "WARN" not in line)[-4000:] if text else ""


@pytest.fixture
def speed_layer_factory(kafka_stack, tmp_path: Path) -> Iterator[Callable[..., SpeedLayerProcess]]:
    started: list[SpeedLayerProcess] = []

    def make(topic: str, namespace: str, *, args: tuple[str, ...] = (), **overrides) -> SpeedLayerProcess:
        settings = replace(kafka_stack.settings, **overrides) if overrides else kafka_stack.settings
        log_path = tmp_path / f"speed_layer-{namespace}.log"
        sl = SpeedLayerProcess(settings, topic, namespace, log_path, args=tuple(args)).start()
        started.append(sl)
        return sl

    yield make
    for sl in started:
        sl.stop()
