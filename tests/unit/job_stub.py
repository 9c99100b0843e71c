"""A stand-in job for the DAG tests: ``python -m tests.unit.job_stub EXIT_CODE [ARGS...]``.

Appends ``{"pid", "args"}`` to ``$JOB_STUB_LOG`` (if set); with ``--child``, starts a
``sleep`` in its own process group (as pyspark starts its JVM) and sleeps itself, so a kill must
reach the whole group; then exits with EXIT_CODE.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def main(argv: list[str]) -> int:
    code, args = int(argv[0]), argv[1:]
    record = {"pid": os.getpid(), "args": args}
    if "--child" in args:
        record["child"] = subprocess.Popen(["sleep", "300"]).pid
    if os.environ.get("JOB_STUB_LOG"):
        with open(os.environ["JOB_STUB_LOG"], "a") as f:
            f.write(json.dumps(record) + "\n")
    if "--child" in args:
        time.sleep(300)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
