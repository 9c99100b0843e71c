"""The alerts on a live stack: Prometheus (Debian's package, SOCIAL_PROMETHEUS=1) scrapes the real
metrics exporter while the generator writes ~500 events/s; the speed layer keeps up and no alert
fires, its keyed query's progress reaches Prometheus through the exporter; then the speed layer is
stopped under the same load and SocialServingLag fires for its namespace.

Skipped without Debian's package (``SOCIAL_PROMETHEUS=1 make setup`` fetches it).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import urllib.request
import uuid
from dataclasses import replace

import pytest

from app_sim.generator import GeneratorConfig, produce
from infra.prometheus import binary
from infra.services import MetricsExporter, PrometheusServer
from tests.conftest import _free_port

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(binary() is None, reason="no prometheus: SOCIAL_PROMETHEUS=1 make setup fetches it"),
]

RATE = 500  # events/s, far under what the speed layer applies on 2 cores (~4,500), even beside a busy CI run


def _api(port: int, path: str, **query) -> dict:
    url = f"http://127.0.0.1:{port}/api/v1/{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    with urllib.request.urlopen(url, timeout=5) as answer:
        return json.loads(answer.read())["data"]


def _firing(port: int, namespace: str) -> set[str]:
    alerts = _api(port, "alerts")["alerts"]
    return {
        a["labels"]["alertname"]
        for a in alerts
        if a["state"] == "firing" and a["labels"].get("namespace") == namespace
    }


def test_serving_lag_fires_when_the_speed_layer_stops_under_load(
    kafka_stack, topic_factory, speed_layer_factory
):
    topic = topic_factory(8)
    namespace = f"alerts{uuid.uuid4().hex[:6]}"
    settings = replace(
        kafka_stack.settings,
        events_topic=topic,
        views_namespace=namespace,
        prometheus=1,
        prometheus_port=_free_port(19090, set()),
        metrics_port=_free_port(19464, set()),
    )
    sl = speed_layer_factory(topic=topic, namespace=namespace, archive=False)
    sl.wait_running()
    exporter, prometheus = MetricsExporter(settings), PrometheusServer(settings)
    stop = threading.Event()

    failed: list[BaseException] = []

    def load() -> None:  # ~RATE events/s until told to stop, in runs of four seconds
        seed = 0
        try:
            while not stop.is_set():
                seed += 1
                # small runs: each must hold its users' registrations and follows (the generator's bootstrap)
                cfg = GeneratorConfig(users=100, seed=seed, mean_followers=3)
                produce(
                    4 * RATE, cfg, topic=topic, bootstrap=kafka_stack.bootstrap, rate=RATE, progress=False
                )
        except BaseException as exc:  # the test fails on it, not on a missing alert
            failed.append(exc)
            raise

    writer = threading.Thread(target=load, daemon=True)
    port = settings.prometheus_port
    try:
        assert exporter.start() == "started" and prometheus.start() == "started"
        writer.start()
        # under load, the speed layer keeps up: its progress reaches Prometheus, nothing fires
        query = f'social_stream_processed_rows_per_second{{query="keyed_{namespace}"}}'
        deadline = time.monotonic() + 120
        while not _api(port, "query", query=query)["result"]:
            assert not failed and time.monotonic() < deadline, failed or f"no {query} in Prometheus"
            time.sleep(2)
        time.sleep(40)  # longer than SocialServingLag's `for`
        assert sl.proc.poll() is None and not failed, failed
        assert _firing(port, namespace) == set()
        lag = _api(port, "query", query=f'sum(social_serving_lag_records{{namespace="{namespace}"}})')[
            "result"
        ]
        assert float(lag[0]["value"][1]) < 5000
        # the speed layer stops; the log keeps growing: the lag alert fires within its `for` + a few scrapes
        sl.stop()
        stopped = time.monotonic()
        while "SocialServingLag" not in _firing(port, namespace):
            assert not failed and time.monotonic() - stopped < 150, failed or _api(port, "alerts")
            time.sleep(2)
        assert 30 <= time.monotonic() - stopped  # not before its `for: 30s`
    finally:
        stop.set()
        writer.join(timeout=30)
        prometheus.stop()
        exporter.stop()
