"""The streaming queries' latest progress, for the metrics exporter (pipelines/metrics.py).

Spark reports each micro-batch of a query to its ``StreamingQueryListener``s in the driver, off
the query's path. :class:`ProgressFile` keeps the latest report of each query of this driver in
``var/run/progress/<query>.json`` (replaced whole: a reader never sees half a file), and
:func:`read` gives the exporter, another process, every query's: so the exporter stays stateless,
as it is for the stores, and a query's figures survive the exporter's restarts. What the exporter
takes from a report: input and processing rates, batch duration, and per Kafka partition the
records the query had not read when it planned the batch (the source's ``latestOffset`` minus
its ``endOffset``: Spark's own view of the lag).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from pyspark.sql.streaming import StreamingQueryListener

from infra.settings import Settings


def progress_dir(settings: Settings) -> Path:
    return Path(settings.run_dir) / "progress"


class ProgressFile(StreamingQueryListener):
    """Writes each query's latest progress report to ``<directory>/<query name>.json``."""

    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._lock = threading.Lock()

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        self.write(event.progress.json)

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass

    def write(self, progress_json: str) -> Path | None:
        """Keep one report (Spark's ``StreamingQueryProgress.json``); None for an unnamed query."""
        progress = json.loads(progress_json)
        name = progress.get("name")
        if not name:
            return None
        path = self.directory / f"{name}.json"
        tmp = path.with_suffix(f".{threading.get_ident()}.tmp")
        with self._lock:
            tmp.write_text(json.dumps(progress, separators=(",", ":")))
            os.replace(tmp, path)
        return path


def read(directory: Path) -> dict[str, dict]:
    """query name -> its latest progress report, for every query that wrote one here."""
    found = {}
    for path in sorted(directory.glob("*.json")) if directory.exists() else []:
        try:
            found[path.stem] = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):  # replaced whole, so only a vanished file
            continue
    return found


def _offsets(value) -> dict[str, dict[str, int]]:
    """A Kafka source's offsets (``{"topic": {"0": 12, ...}}``, given as JSON text or parsed)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return {}
    return value if isinstance(value, dict) else {}


def partition_lag(progress: dict) -> dict[tuple[str, int], int]:
    """(topic, partition) -> records the query's Kafka sources had not read when it planned its
    latest batch: the source's ``latestOffset`` (the log's end then) minus its ``endOffset``."""
    lag: dict[tuple[str, int], int] = {}
    for source in progress.get("sources") or []:
        latest, end = _offsets(source.get("latestOffset")), _offsets(source.get("endOffset"))
        for topic, partitions in latest.items():
            for partition, last in partitions.items():
                read_to = end.get(topic, {}).get(partition, last)
                lag[(topic, int(partition))] = max(0, int(last) - int(read_to))
    return lag
