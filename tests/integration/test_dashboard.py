"""The dashboard in a real browser: the metrics exporter's /dashboard, opened by headless Chromium
(Debian's chromium-headless-shell driven by Playwright) while events flow through the real stack.

A speed layer and its archiver (Spark) apply a topic of the session's Kafka into Redis and Delta, the
generator writes ~RATE events/s straight to the log, and a client writes and reads through the app
API (``python -m app_sim.api``); the exporter samples every second. Once its history holds points
on every series, the page is opened, and after it rendered every panel must say (``data-points``)
that its sparsest series has points; the screenshot goes to var/reports/dashboard/. The same points
are checked against what the exporter served: the lag panel has the topic's 8 partitions, records
read = records decided in every point (the accounting), the API's rate counts the client's requests.
With Debian's Prometheus here (``make test`` fetches it), a Prometheus scrapes the same exporter and
API, and every query of Grafana's dashboard (the same panels in compose) must answer with data.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import urllib.request
import uuid
from dataclasses import replace

import httpx
import pytest

from app_sim.generator import GeneratorConfig, produce
from infra.prometheus import binary
from infra.settings import get_settings
from pipelines.dashboard import GRAFANA_QUERIES, PANELS
from tests.conftest import _free_port

pytestmark = pytest.mark.integration

RATE = 200  # events/s from the generator
MIN_POINTS = 8  # per series, before the page is opened and in what it drew
SCREENSHOT = get_settings().reports_dir / "dashboard" / "screenshot.png"  # the project's var/reports


def _data(settings) -> dict:
    with urllib.request.urlopen(
        f"http://127.0.0.1:{settings.metrics_port}/dashboard/data.json", timeout=5
    ) as a:
        return json.loads(a.read())


def _prometheus(settings, expr: str) -> list:
    """The series an instant query of Prometheus answers with (non-NaN values only)."""
    url = f"http://127.0.0.1:{settings.prometheus_port}/api/v1/query?" + urllib.parse.urlencode(
        {"query": expr}
    )
    with urllib.request.urlopen(url, timeout=10) as a:
        result = json.loads(a.read())["data"]["result"]
    return [r for r in result if r["value"][1] not in ("NaN", "+Inf", "-Inf")]


def _sparsest(data: dict) -> dict[str, int]:
    """Panel -> the non-null points of its sparsest series (what the page's data-points says)."""
    out = {}
    for panel, *_ in PANELS:
        counts = [sum(v is not None for v in col) for col in data[panel].values()]
        out[panel] = min(counts) if counts else 0
    return out


def test_every_panel_plots_points_while_events_flow(kafka_stack, topic_factory, speed_layer_factory):
    from playwright.sync_api import sync_playwright

    from infra.browser import ensure_chromium
    from infra.stack import ApiServer, MetricsExporter, PrometheusServer

    chromium = ensure_chromium()
    started = time.monotonic()
    topic = topic_factory(8)
    namespace = f"dash{uuid.uuid4().hex[:6]}"
    settings = replace(
        kafka_stack.settings,
        events_topic=topic,
        views_namespace=namespace,
        metrics_port=_free_port(19464, set()),
        api_port=_free_port(18000, set()),
        api_workers=1,
        dashboard_sample_s=1.0,
        prometheus=1,
        prometheus_port=_free_port(19090, set()),
    )
    # the archiver appends every 10 s, so its lag falls and rises within the test
    sl = speed_layer_factory(topic=topic, namespace=namespace, archive_interval_s=10.0)
    exporter, api = MetricsExporter(settings), ApiServer(settings)
    # Grafana's panels (compose) are PromQL over a Prometheus scraping the same exporter and API:
    # with Debian's package here (make test fetches it), each is asked on this stack too
    prometheus = PrometheusServer(settings) if binary() is not None else None
    stop = threading.Event()
    failed: list[BaseException] = []
    requests_sent = [0]

    def generator() -> None:
        seed = 0
        try:
            while not stop.is_set():
                seed += 1
                cfg = GeneratorConfig(users=100, seed=seed, mean_followers=3, realtime=True)  # received now
                produce(
                    4 * RATE, cfg, topic=topic, bootstrap=kafka_stack.bootstrap, rate=RATE, progress=False
                )
        except BaseException as exc:
            failed.append(exc)
            raise

    def client() -> None:  # writes and reads through the API, ~20 requests/s
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{settings.api_port}", timeout=10) as http:
                tokens = []
                for i in range(5):
                    answer = http.post("/v1/users", json={"handle": f"dash{i}", "display_name": f"D {i}"})
                    assert answer.status_code == 201, answer.text
                    tokens.append(answer.json()["token"])
                    requests_sent[0] += 1
                n = 0
                while not stop.is_set():
                    auth = {"Authorization": f"Bearer {tokens[n % len(tokens)]}"}
                    if n % 2:
                        answer = http.post("/v1/posts", json={"text": f"post {n}"}, headers=auth)
                    else:
                        answer = http.get("/v1/timeline", params={"limit": 20}, headers=auth)
                    assert answer.status_code < 400, answer.text
                    requests_sent[0] += 1
                    n += 1
                    time.sleep(0.05)
        except BaseException as exc:
            failed.append(exc)
            raise

    threads = [threading.Thread(target=f, daemon=True) for f in (generator, client)]
    try:
        assert api.start() == "started" and exporter.start() == "started"
        assert prometheus is None or prometheus.start() == "started"
        sl.wait_running()
        for t in threads:
            t.start()
        # the exporter's history fills: every series of every panel has points
        deadline = time.monotonic() + 120
        while min((sparsest := _sparsest(data := _data(settings))).values()) < MIN_POINTS:
            assert not failed and time.monotonic() < deadline, failed or f"too few points: {sparsest}"
            time.sleep(2)
        print(f"history filled {time.monotonic() - started:.0f} s after the start: {sparsest}")

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                page.goto(settings.dashboard_url)
                page.wait_for_function(
                    "n => [...document.querySelectorAll('[data-panel]')].every(p => Number(p.dataset.points) >= n)",
                    arg=MIN_POINTS,
                    timeout=30_000,
                )
                time.sleep(1.5)  # let one more refresh land, so the picture is the page at rest
                drawn = page.eval_on_selector_all(
                    "[data-panel]",
                    "ps => ps.map(p => [p.dataset.panel, Number(p.dataset.points), Number(p.dataset.series),"
                    " p.querySelectorAll('canvas').length, p.querySelector('.note').textContent])",
                )
                SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(SCREENSHOT), full_page=True)
            finally:
                browser.close()
        print(f"screenshot {SCREENSHOT}")
        for row in drawn:
            print("panel", row)
        panels = {name: (points, series, canvases, note) for name, points, series, canvases, note in drawn}
        assert list(panels) == [p[0] for p in PANELS]
        for name, (points, series, canvases, _note) in panels.items():
            assert points >= MIN_POINTS and canvases == 1, (name, points, canvases)
            assert series == {"lag": 8, "accounting": 4}.get(name, 2), (name, series)
        assert "unaccounted 0" in panels["accounting"][3], panels["accounting"][3]

        # what the exporter served: the accounting holds in every point, the API counts the client
        data = _data(settings)
        assert {v for v in data["unaccounted"] if v is not None} == {0}  # records read = records decided
        assert sum(data["totals"]["decided"].values()) > 0
        rates = [v for v in data["api"]["requests/s"] if v is not None]
        assert max(rates) >= 5, rates  # the client's ~20/s, less its pauses (the exporter's scrapes excluded)
        p99 = [v for v in data["api"]["p99 (ms)"] if v is not None]
        assert 0 < max(p99) < 10_000, p99
        fresh = [v for v in data["freshness"]["p99 (s)"] if v is not None]
        assert 0 < max(fresh) < 120, fresh  # measured, not the speed layer's 120 s cap
        if prometheus is not None:
            empty = {}
            for pid, queries in GRAFANA_QUERIES.items():
                for expr, *_ in queries:
                    if not _prometheus(settings, expr):
                        empty.setdefault(pid, []).append(expr)
            assert empty == {}, f"Grafana panels with no data in Prometheus: {empty}"
        assert not failed, failed
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
        exporter.stop()
        api.stop()
        if prometheus is not None:
            prometheus.stop()
    print(f"whole test {time.monotonic() - started:.0f} s")
