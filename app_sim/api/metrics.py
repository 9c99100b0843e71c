"""The app API's own Prometheus metrics, served on ``GET /metrics`` (docs/metrics.md, "The API").

Three metrics, all from inside the request path and kept cheap (a dict lookup and two mmap or
memory writes per request; no per-request label parsing):

- ``social_api_requests_total{route, method, status}``: requests answered, by route *template*
  (``/v1/users/{user_id}/status``, never the raw path; ``unmatched`` when no route matched, so
  a fuzzer or a scanner cannot grow the label set);
- ``social_api_request_seconds{route, method}``: latency, request in -> last byte out, in buckets
  around the read target (p99 <= 50 ms);
- ``social_api_appends_total{outcome, type}``: appends to the event log by outcome
  (``acknowledged`` by the broker, or ``failed``: no ack in time, refused) and event type.

The API runs as several uvicorn worker processes, so in production the values live in
prometheus-client's multiprocess mode: ``python -m app_sim.api`` (the parent, before any worker
starts) empties :func:`multiproc_dir` and sets ``PROMETHEUS_MULTIPROC_DIR`` to it; each worker
writes its own files there and ``/metrics``, whichever worker answers, reads them all
(``MultiProcessCollector``), so one scrape sees every worker. Without that variable (an API
built in-process, as the tests do) each app keeps its values in a registry of its own.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    values,
)
from prometheus_client.multiprocess import MultiProcessCollector

from infra.settings import Settings

ENV = "PROMETHEUS_MULTIPROC_DIR"
# seconds: fine around the read target (50 ms), coarse up to the produce timeout
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
UNMATCHED = "unmatched"
CONTENT_TYPE = CONTENT_TYPE_LATEST


def multiproc_dir(settings: Settings) -> Path:
    """Where the API's workers keep their metric files: one directory per API port under run/."""
    return settings.run_dir / f"api-{settings.api_port}-metrics"


def prepare_multiproc_dir(settings: Settings) -> Path:
    """Empty the API's metric directory and point ``PROMETHEUS_MULTIPROC_DIR`` at it.

    Called by the parent before the workers start (they inherit the variable): files of an
    earlier run would otherwise be added to this run's counters.
    """
    path = multiproc_dir(settings)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, exist_ok=True)
    os.environ[ENV] = str(path)
    return path


def multiprocess() -> bool:
    """Whether this process's metric values live in the multiprocess directory.

    Decided by prometheus-client when it was first imported (the variable set or not then): a
    single-worker uvicorn runs the app in the parent, which imported it before the variable.
    """
    return bool(getattr(values.ValueClass, "_multiprocess", False)) and bool(os.environ.get(ENV))


class ApiMetrics:
    """One app's metrics; ``exposition()`` is the /metrics body."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter(
            "social_api_requests",
            "HTTP requests answered by the app API, by route template, method and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "social_api_request_seconds",
            "app API request latency (request in -> response sent), by route template and method",
            ["route", "method"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.appends = Counter(
            "social_api_appends",
            "appends to the event log by outcome (acknowledged by the broker, failed) and event type",
            ["outcome", "type"],
            registry=self.registry,
        )
        self._children: dict[tuple[str, str, int], tuple] = {}

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        key = (route, method, status)
        children = self._children.get(key)
        if children is None:
            children = (self.requests.labels(route, method, str(status)), self.latency.labels(route, method))
            self._children[key] = children
        children[0].inc()
        children[1].observe(seconds)

    def exposition(self) -> bytes:
        if multiprocess():
            registry = CollectorRegistry()
            MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)


def route_template(scope: dict) -> str:
    route = scope.get("route")
    return getattr(route, "path", None) or UNMATCHED


class MetricsMiddleware:
    """Pure ASGI (no BaseHTTPMiddleware task hop): counts and times every HTTP request."""

    def __init__(self, app, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # an exception before any response: the server answers 500

        async def send_status(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.observe(route_template(scope), scope["method"], status, time.perf_counter() - start)


class CountedLog:
    """The event log with its appends counted by outcome; everything else passes through."""

    def __init__(self, log, metrics: ApiMetrics) -> None:
        self._log = log
        self._appends = metrics.appends

    async def append(self, event: dict):
        try:
            at = await self._log.append(event)
        except Exception:  # not a cancelled request: its event may still be acknowledged
            self._appends.labels("failed", event.get("type", "")).inc()
            raise
        self._appends.labels("acknowledged", event.get("type", "")).inc()
        return at

    def __getattr__(self, name):
        return getattr(self._log, name)
