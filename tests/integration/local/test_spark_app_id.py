"""Two Spark drivers started in the same millisecond get the same application id (``local-<ms>``);
the second must not die of it (pipelines/spark.py, ``APP_ID_TAKEN``)."""

from __future__ import annotations

import subprocess
import sys

from infra.settings import REPO_ROOT

# A real driver with its event log, as every job runs: the first session takes the JVM up; then
# every id of the next 4 s is taken (as a driver started beside it would take one), and the
# second session is created inside that window (a context starts in well under a second, even on
# a busy machine; the retries go on for 10 s).
SCRIPT = r"""
import logging, sys, time
from pathlib import Path
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(name)s %(levelname)s %(message)s")
from infra.settings import get_settings
from pipelines.spark import build_spark
settings = get_settings(var_dir=Path(sys.argv[1]), spark_master="local[1]")
build_spark("first", settings).stop()
events = Path(settings.var_dir) / "spark-events"
taken_from = int(time.time() * 1000)
for ms in range(taken_from, taken_from + 4000):
    (events / f"eventlog_v2_local-{ms}").mkdir()
spark = build_spark("second", settings)
print("TAKEN", taken_from, taken_from + 4000, "GOT", spark.sparkContext.applicationId)
spark.stop()
"""


def test_a_driver_whose_application_id_is_taken_starts_with_the_next_one(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("TAKEN"))
    _, _, end, _, app_id = line.split()
    assert app_id.startswith("local-")
    assert int(app_id.removeprefix("local-")) >= int(end)  # an id after the taken ones
    # it was refused at least once and tried again (the log says so), not lucky
    assert "Retrying" in done.stdout and "Target log directory already exists" in done.stdout
