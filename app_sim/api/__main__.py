"""``python -m app_sim.api``: serve the app API with uvicorn on ``api_host:api_port``.

Each of ``--workers`` processes (default ``settings.api_workers``) builds the app from the
environment (``SOCIAL_*`` settings) and claims its own snowflake worker id. Before they start,
this parent empties the API's Prometheus directory and sets ``PROMETHEUS_MULTIPROC_DIR`` (the
workers inherit it), so ``GET /metrics`` on any worker reports them all (app_sim/api/metrics.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import uvicorn

from app_sim.api.metrics import prepare_multiproc_dir
from infra.cli import command_name, run_main
from infra.settings import get_settings


def main(argv: list[str] | None = None) -> int:
    settings = get_settings()
    p = argparse.ArgumentParser(prog=command_name("app_sim.api"), description=__doc__.splitlines()[0])
    p.add_argument("--host", default=settings.api_host)
    p.add_argument("--port", type=int, default=settings.api_port)
    p.add_argument("--workers", type=int, default=settings.api_workers)
    p.add_argument("--log-level", default="warning")
    a = p.parse_args(argv)
    # the directory is per port: name it from the port this process serves
    prepare_multiproc_dir(dataclasses.replace(settings, api_port=a.port))
    uvicorn.run(
        "app_sim.api:create_app",
        factory=True,
        host=a.host,
        port=a.port,
        workers=a.workers,
        log_level=a.log_level,
        access_log=False,  # a line per request would cost more than the request at load-test rates
        loop="uvloop",
        http="httptools",
        timeout_graceful_shutdown=10,
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "app_sim.api"))
