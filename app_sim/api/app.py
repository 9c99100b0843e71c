"""The FastAPI application: ``create_app`` wires the process state, the error mapping and the routes.

See the package docstring for the rules. The parts: :mod:`app_sim.api.state` (the process state,
:class:`~app_sim.api.state.Api`), :mod:`app_sim.api.errors` (error bodies and their handlers),
:mod:`app_sim.api.deps` (caller, client headers), :mod:`app_sim.api.commands` (a command appended
as an event, with its idempotency record) and :mod:`app_sim.api.routes` (one module per resource);
:mod:`app_sim.api.fastpath` answers the common GET /v1/timeline without FastAPI's request machinery.
"""

from __future__ import annotations

import sys
from contextlib import asynccontextmanager

from fastapi import FastAPI
from uvicorn.config import STARTUP_FAILURE

from app_sim import auth
from app_sim.api import dual_write, errors
from app_sim.api import metrics as api_metrics
from app_sim.api.deps import client_headers
from app_sim.api.errors import ApiError
from app_sim.api.eventlog import EventLog
from app_sim.api.fastpath import TimelineFastPath
from app_sim.api.routes import ROUTERS
from app_sim.api.state import Api
from contract import keys, writers
from contract.ids import Snowflake
from infra import clients
from infra.settings import Settings, get_settings

__all__ = ["ApiError", "claim_worker_id", "client_headers", "create_app"]


def claim_worker_id(settings: Settings) -> int:
    """This API process's snowflake worker id, one of its own for the life of the log.

    Claimed in the log's registry of writers in Kafka (``contract.writers``), so no other API
    process, on this host or another, and no generator run ever mints ids with it, whatever a
    Redis FLUSHALL, a restore or a restart does; never given back. Raises
    :class:`~contract.writers.WriterIdUnavailable` (a one-line message) when none can be had.
    """
    return writers.allocate(settings, "api").worker_id


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    # before serving: a process without a worker id of its own refuses to start, with one line and
    # uvicorn's "failed to start" status (its supervisor then stops instead of restarting it)
    try:
        worker_id = claim_worker_id(settings)
    except writers.WriterIdUnavailable as exc:
        print(f"app API: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(STARTUP_FAILURE) from None
    metrics = api_metrics.ApiMetrics()  # GET /metrics (app_sim/api/metrics.py, docs/metrics.md)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # asyncio all the way: a read is a pipelined round trip or two on the event loop, no
        # thread hops; a Redis that hangs fails the request after 5 s (503), not the process.
        client = clients.redis_client(settings.redis_url, "request", decode_responses=True, asyncio=True)
        log = EventLog(settings, settings.events_topic, settings.api_produce_timeout_ms)
        # the partitioned layout finds a user's keys by the topic's partition count (the broker's)
        partitions = (
            log.partitions(settings.events_partitions) if settings.serving_layout == "partitioned" else 0
        )
        # SOCIAL_WRITE_MODE=dual / SOCIAL_FAULT_*: the measured anti-pattern (make dual-write); off by default
        log = dual_write.wrap(log, client, settings, worker_id)
        log = api_metrics.CountedLog(log, metrics)  # appends by outcome, on /metrics
        keystore = keys.KeyStore.for_settings(settings)
        app.state.api = Api(
            settings=settings,
            redis=client,
            log=log,
            tokens=auth.TokenSigner(auth.load_secret(settings)),
            ids=Snowflake(worker_id),
            keystore=keystore,
            sealer=keys.Sealer(keystore, cache=False) if settings.seal_personal_data else None,
            partitions=partitions,
        )
        try:
            yield
        finally:
            log.close()
            await client.aclose()
            keystore.close()

    app = FastAPI(
        title="kappa-social app API",
        version="1",
        summary="Commands append events to the log; reads come from the serving store with as_of.",
        lifespan=lifespan,
    )
    app.state.metrics = metrics  # read by GET /metrics (app_sim/api/routes/ops.py)
    # GET /v1/timeline's common case without FastAPI in the way (app_sim/api/fastpath.py); added
    # first, so it runs inside the metrics middleware (added last, outermost)
    app.add_middleware(TimelineFastPath)
    app.add_middleware(api_metrics.MetricsMiddleware, metrics=metrics)
    for exc_class, handler in errors.HANDLERS:
        app.add_exception_handler(exc_class, handler)
    for router in ROUTERS:
        app.include_router(router)
    return app
