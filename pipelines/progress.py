"""Progress bars for the long batch jobs (verify, replay, rebuild), on tqdm.

- :func:`spark_tasks` follows a Spark application's tasks through its status tracker: the bar's
  total grows as stages are submitted, and advances as their tasks complete (a replay of the log
  is one task per Kafka partition and stage, so this is the replay's progress).
- :func:`log_position` follows a build of a namespace: events applied (the sum of its fences in
  Redis) against the log's end offsets.

Both run in a daemon thread and draw only on a terminal (``disable=None``: nothing in an Airflow
task log or a pipe).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable


def _follow(bar, read: Callable[[], tuple[int, int] | None], stop: threading.Event, every_s: float) -> None:
    while not stop.wait(every_s):
        try:
            got = read()
        except Exception:  # noqa: BLE001 - a progress bar never fails the job it shows
            continue
        if got is not None:
            done, total = got
            bar.total = max(total, done)
            bar.n = done
            bar.refresh()
    bar.close()


def _start(
    desc: str, unit: str, read: Callable[[], tuple[int, int] | None], every_s: float
) -> threading.Event:
    from tqdm import tqdm

    bar = tqdm(desc=desc, unit=unit, total=0, disable=None, file=sys.stderr, dynamic_ncols=True)
    stop = threading.Event()
    if bar.disable:
        return stop
    threading.Thread(
        target=_follow, args=(bar, read, stop, every_s), daemon=True, name=f"progress-{desc}"
    ).start()
    return stop


def spark_tasks(spark, desc: str, every_s: float = 0.5) -> threading.Event:
    """A bar of the tasks of every stage this application ran or runs; set the returned event to stop."""
    tracker = spark.sparkContext.statusTracker()
    seen: dict[int, tuple[int, int]] = {}  # stage id -> (completed, total)

    def read() -> tuple[int, int]:
        for job_id in tracker.getActiveJobsIds():
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job else []:
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    seen[stage_id] = (stage.numCompletedTasks, stage.numTasks)
        return sum(d for d, _ in seen.values()), sum(t for _, t in seen.values())

    return _start(desc, "task", read, every_s)


def log_position(
    read_applied: Callable[[], int], log_end: int, desc: str, every_s: float = 2.0
) -> threading.Event:
    """A bar of events applied (``read_applied()``) out of ``log_end``."""
    return _start(desc, "ev", lambda: (read_applied(), log_end), every_s)
