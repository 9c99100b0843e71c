"""``python -m app_sim.api``: serve the app API with uvicorn on ``api_host:api_port``.

Each of ``--workers`` processes (default ``settings.api_workers``) builds the app from the
environment (``SOCIAL_*`` settings) and claims its own snowflake worker id.
"""

from __future__ import annotations

import argparse
import sys

import uvicorn

from infra.settings import get_settings


def main(argv: list[str] | None = None) -> int:
    settings = get_settings()
    p = argparse.ArgumentParser(prog="python -m app_sim.api", description=__doc__.splitlines()[0])
    p.add_argument("--host", default=settings.api_host)
    p.add_argument("--port", type=int, default=settings.api_port)
    p.add_argument("--workers", type=int, default=settings.api_workers)
    p.add_argument("--log-level", default="warning")
    a = p.parse_args(argv)
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
    sys.exit(main())
