"""``make history``: the Spark History Server over the event logs in ``var/spark-events``.

Every Spark application of the project (speed layer, verify, replay, rebuild, quality, analytics)
writes its event log there (``pipelines/spark.py``), so finished jobs can be inspected like
running ones: ``make history``, then http://127.0.0.1:18080 (``--port``). Foreground; Ctrl-C
stops it. Runs the server class from pyspark's own jars (``bin/spark-class``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from infra.cli import command_name, run_main
from infra.settings import get_settings


def command(events: Path, port: int) -> tuple[list[str], dict[str, str]]:
    import pyspark

    home = Path(pyspark.__file__).parent
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_HISTORY_OPTS": (
            f"-Dspark.history.fs.logDirectory={events.resolve().as_uri()} "
            f"-Dspark.history.ui.port={port} -Dspark.history.fs.update.interval=5s"
        ),
    }
    return [str(home / "bin" / "spark-class"), "org.apache.spark.deploy.history.HistoryServer"], env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=command_name("infra.history"), description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=18080)
    args = p.parse_args(argv)
    events = Path(get_settings().var_dir) / "spark-events"
    events.mkdir(parents=True, exist_ok=True)
    cmd, env = command(events, args.port)
    print(f"Spark History Server over {events}: http://127.0.0.1:{args.port}", flush=True)
    os.execve(cmd[0], cmd, env)


if __name__ == "__main__":
    sys.exit(run_main(main, "infra.history"))
