"""The keyed speed layer (and its archiver) as child processes, the way ``make up`` runs them.

One harness for everything that needs a speed layer of its own beside the stack: the integration
tests (``tests/integration/conftest.py``), the dual-write experiment (``stories/dual_write.py``) and
the benchmarks (``stories/bench_keyed.py``, ``stories/bench_analytics.py``). Each process gets its own
session (process group), so a stop or a crash takes the Python driver and its JVM together.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from infra.settings import Settings


class SpeedLayerError(RuntimeError):
    """The speed layer or its archiver exited, did not start, or did not reach a position in time."""


@dataclass
class SpeedLayerProcess:
    settings: Settings
    topic: str
    namespace: str
    log_path: Path
    args: tuple[str, ...] = ()
    archive: bool = True  # with the archiver; set False before a restart to run without it
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
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.proc = self._spawn("pipelines.speed_layer", self.log_path, *self.args)
        if self.archive and (self.archiver is None or self.archiver.poll() is not None):
            self.start_archiver()
        return self

    def start_archiver(self) -> None:
        self.archiver = self._spawn("pipelines.archiver", self.archiver_log)

    def kill9_archiver(self) -> None:
        _kill9(self.archiver)

    def store(self):
        """The serving store's dumps (``contract.serving``) in this speed layer's layout."""
        from contract.serving import PartitionedStore, ServingStore, connect

        if self.settings.serving_layout == "partitioned":
            return PartitionedStore(connect(self.settings.redis_url), self.namespace, self.partitions())
        return ServingStore(connect(self.settings.redis_url), self.namespace)

    def partitions(self) -> int:
        """The event topic's partition count (read once)."""
        if not hasattr(self, "_partitions"):
            from pipelines.speed.stream import topic_partitions

            self._partitions = len(topic_partitions(self.settings, self.topic))
        return self._partitions

    def lake_position(self) -> dict[int, int]:
        """The log position the Delta views cover."""
        from pipelines.lake import committed_position

        committed = committed_position(self.settings.lake_dir, self.namespace)
        return committed[1] if committed else {}

    def redis_position(self) -> dict[int, int]:
        """The log position the keyed state in Redis covers (its fences; in the partitioned layout,
        with every delivery caused below them applied)."""
        if self.settings.serving_layout != "partitioned":
            return self.store().fences()
        from contract import functions

        client = functions.connect(self.settings.redis_url)
        return functions.layout_fences(client, self.namespace, "partitioned", self.partitions())

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
                raise SpeedLayerError(
                    f"speed layer exited with {self.proc.returncode}; see {self.log_path}:\n{self.tail()}"
                )
            if self.archive and self.archiver is not None and self.archiver.poll() is not None:
                raise SpeedLayerError(
                    f"archiver exited with {self.archiver.returncode}; see {self.archiver_log}:\n"
                    + self.tail(path=self.archiver_log)
                )
            got = self.position()
            if all(got.get(int(p), 0) >= o for p, o in offsets.items()):
                return got
            if time.monotonic() > deadline:
                raise SpeedLayerError(
                    f"speed layer at {got}, wanted {offsets}; see {self.log_path}:\n{self.tail()}"
                )
            time.sleep(0.5)

    def wait_applied(self, records: int, timeout: float = 300.0) -> int:
        """Block until the keyed state has applied ``records`` records in all (mid-run, for a fault
        test); a speed layer that exits meanwhile fails at once, with its log, not at the timeout."""
        deadline = time.monotonic() + timeout
        while (done := sum(self.redis_position().values())) < records:
            if self.proc is not None and self.proc.poll() is not None:
                raise SpeedLayerError(
                    f"speed layer exited with {self.proc.returncode}; see {self.log_path}:\n{self.tail()}"
                )
            if time.monotonic() > deadline:
                raise SpeedLayerError(f"speed layer at {done} of {records} records; see {self.log_path}")
            time.sleep(0.1)
        return done

    def wait_caught_up(self, timeout: float = 300.0) -> dict[int, int]:
        from confluent_kafka import KafkaException
        from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

        from infra.stack import StackError, end_offsets

        # the log's end, waiting out a broker that has just restarted and does not know the
        # topic's leaders yet (its reads answer "not leader" or "unknown topic" for a while)
        ends = Retrying(
            retry=retry_if_exception_type((StackError, KafkaException)),
            wait=wait_fixed(1),
            stop=stop_after_delay(min(timeout, 120.0)),
            reraise=True,
        )(end_offsets, self.settings, self.topic)
        return self.wait_for(ends, timeout)

    def wait_running(self, timeout: float = 180.0) -> None:
        """Block until the current process has its streaming query running (JVM up, query started)."""
        assert self.proc is not None, "wait_running() waits for a process start() started"
        deadline = time.monotonic() + timeout
        while self.log_path.read_bytes().count(b"speed layer running") < self.restarts + 1:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SpeedLayerError(f"speed layer did not start; see {self.log_path}:\n{self.tail()}")
            time.sleep(0.2)

    def archives_started(self) -> int:
        """How many archives the archivers of this harness have begun (their log's start lines)."""
        try:
            return self.archiver_log.read_bytes().count(b": starting, offsets")
        except FileNotFoundError:
            return 0

    def last_archive_seconds(self) -> float | None:
        """What the last archive the archivers finished took (their log's ``in <s>s`` lines)."""
        try:
            took = re.findall(rb"archive \d+: \d+ records .* in ([\d.]+)s", self.archiver_log.read_bytes())
        except FileNotFoundError:
            return None
        return float(took[-1]) if took else None

    def wait_archive_started(self, after: int, timeout: float = 180.0) -> None:
        """Block until an archive beyond the first ``after`` has begun (to crash the archiver in one)."""
        deadline = time.monotonic() + timeout
        while self.archives_started() <= after:
            if self.archiver is None or self.archiver.poll() is not None or time.monotonic() > deadline:
                raise SpeedLayerError(
                    f"no archive began; see {self.archiver_log}:\n" + self.tail(path=self.archiver_log)
                )
            time.sleep(0.1)

    def restart(self) -> None:
        self.restarts += 1
        self.start()

    def kill9(self) -> None:
        """Crash the speed layer: SIGKILL to its whole process group (the Python driver and its JVM)."""
        _kill9(self.proc)

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop both as ``make down`` does: SIGTERM to each Python driver only. It stops its queries
        between micro-batches (the archiver between steps) and exits; its JVM exits when the
        driver's pipe closes. A group that outlives ``timeout_s`` is killed with SIGKILL.

        (SIGTERM to the whole group instead kills the JVM under a driver in the middle of a Py4J
        call; that call then sometimes hung until a 60 s timeout: a minute lost per stop.)
        """
        running = [p for p in (self.proc, self.archiver) if p is not None and p.poll() is None]
        for proc in running:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in running:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _wait_group(proc.pid, deadline)
            proc.wait()  # reaped (killed at the deadline if it had not exited by then)

    def tail(self, lines: int = 40, path: Path | None = None) -> str:
        try:
            text = (path or self.log_path).read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(line for line in text if "WARN" not in line)[-4000:] if text else ""


def _wait_group(pgid: int, deadline: float) -> None:
    """Until no live process of the group is left (SIGKILL to what is left at the deadline)."""
    while _live_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _live_members(pgid):
        os.killpg(pgid, signal.SIGKILL)
        while _live_members(pgid):
            time.sleep(0.05)


def _live_members(pgid: int) -> list[int]:
    """The group's processes that are not zombies (an orphan's zombie waits for init to reap it)."""
    from infra.processes import group_members

    return group_members(pgid)


def _kill9(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
