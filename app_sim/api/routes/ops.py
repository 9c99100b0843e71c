"""For operators, no token: ``GET /v1/health`` (in the OpenAPI document) and ``GET /metrics`` (not)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app_sim.api import metrics as api_metrics
from app_sim.api import models as m
from app_sim.api.errors import ERRORS, json_response
from app_sim.api.state import ApiState

metrics_router = APIRouter()
router = APIRouter()


@metrics_router.get("/metrics", include_in_schema=False)
async def prometheus_metrics(request: Request):
    # Prometheus text format, no token (like /v1/health); every worker's values in one scrape
    # (app.state.metrics: the ApiMetrics of create_app, app_sim/api/metrics.py, docs/metrics.md)
    return Response(request.app.state.metrics.exposition(), media_type=api_metrics.CONTENT_TYPE)


@router.get("/v1/health", response_model=m.Health, responses={503: ERRORS[503]}, tags=["ops"])
async def health(api: ApiState):
    """200 when the process serves and Redis answers."""
    await api.redis.ping()
    return json_response(
        {"status": "ok", "namespace": await api.namespace(), "topic": api.settings.events_topic}
    )
