"""The dashboard's parts without a browser (pipelines/dashboard.py): its arithmetic worked by hand,
the ring buffer's bound, the pages the exporter serves, the vendored uPlot against its manifest, and
Grafana's dashboard (the same panels, PromQL that promtool parses, metrics the project exports).
The page in a real browser on a live stack: tests/integration/test_dashboard.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request

import pytest

from infra.prometheus import binary
from infra.settings import REPO_ROOT
from pipelines import dashboard
from pipelines.dashboard import (
    GRAFANA_DASHBOARD,
    GRAFANA_QUERIES,
    PANELS,
    History,
    api_counters,
    hist_quantile,
    le_quantile,
    point,
    raw,
)


def test_freshness_quantile_is_the_upper_bound_of_its_10ms_bucket():
    hist = {0: 50, 4: 45, 99: 5}  # 50 events in [0, 10) ms, 45 in [40, 50), 5 in [990, 1000)
    assert hist_quantile(hist, 10, 0.5) == 0.01
    assert hist_quantile(hist, 10, 0.9) == 0.05
    assert hist_quantile(hist, 10, 0.99) == 1.0
    assert hist_quantile({}, 10, 0.99) is None


def test_latency_quantile_is_prometheus_histogram_quantile():
    # cumulative by le: 60 under 10 ms, 90 under 20 ms, 100 under 50 ms
    buckets = {0.01: 60.0, 0.02: 90.0, 0.05: 100.0, float("inf"): 100.0}
    assert le_quantile(buckets, 0.5) == pytest.approx(0.01 * 50 / 60)
    assert le_quantile(buckets, 0.75) == pytest.approx(0.015)  # halfway through (10, 20] ms
    assert le_quantile(buckets, 0.99) == pytest.approx(0.02 + 0.03 * 9 / 10)
    assert le_quantile({0.01: 0.0, float("inf"): 0.0}, 0.99) is None
    assert le_quantile({0.01: 1.0, float("inf"): 10.0}, 0.99) == 0.01  # in +Inf: the last finite bound


def test_api_counters_leave_the_scrapes_of_metrics_out():
    text = "\n".join(
        [
            "# TYPE social_api_requests_total counter",
            'social_api_requests_total{route="/v1/timeline",method="GET",status="200"} 7.0',
            'social_api_requests_total{route="/metrics",method="GET",status="200"} 100.0',
            "# TYPE social_api_request_seconds histogram",
            'social_api_request_seconds_bucket{route="/v1/timeline",method="GET",le="0.01"} 5.0',
            'social_api_request_seconds_bucket{route="/v1/timeline",method="GET",le="+Inf"} 7.0',
            'social_api_request_seconds_bucket{route="/metrics",method="GET",le="0.01"} 100.0',
            'social_api_request_seconds_bucket{route="/metrics",method="GET",le="+Inf"} 100.0',
            "",
        ]
    )
    assert api_counters(text) == {"requests": 7.0, "buckets": {0.01: 5.0, float("inf"): 7.0}}


def _snap(t: float, applied: int, fence: int, hist: dict[int, int]) -> dict:
    return {
        "namespace": "v1",
        "end": {0: fence + 10, 1: 0},
        "fence": {0: fence, 1: 0},
        "archive": {0: 0},
        "archived_at": t - 4,
        "stats": {0: {"applied": applied}, 1: {}},
        "freshness": hist,
        "bucket_ms": 10,
    }


def test_points_rates_and_quantiles_over_the_window():
    a = raw(_snap(100, 0, 0, {}), {"requests": 10.0, "buckets": {0.1: 10.0, float("inf"): 10.0}}, 100.0)
    b = raw(
        _snap(110, 500, 500, {1: 400, 20: 100}),
        {"requests": 60.0, "buckets": {0.1: 59.0, float("inf"): 60.0}},
        110.0,
    )
    p = point(b, a)
    assert p["lag"] == {"0": 10, "1": 0}
    assert p["archive_lag"] == 510 and p["archive_behind"] == 500 and p["archive_age_s"] == 4.0
    assert p["rates"] == {"applied": 50.0, "duplicates": 0.0, "rejected": 0.0, "quarantined": 0.0}
    assert p["unaccounted"] == 0  # 500 read (the fences), 500 decided
    assert (p["fresh_p50"], p["fresh_p99"]) == (0.02, 0.21)
    assert p["api_rps"] == 5.0
    assert p["api_p99_ms"] == pytest.approx(100.0)  # the 50th of 50 in the window is in (0.1, +Inf]: 0.1 s
    first = point(a, None)  # nothing to compare with: levels only, no rates (gaps on the plots)
    assert "rates" not in first and "api_rps" not in first and first["lag"] == {"0": 10, "1": 0}
    down = point(raw(None, None, 120.0), a)  # the stores did not answer: a point of gaps
    assert set(down) == {"t"}


def test_the_history_is_a_bounded_ring_buffer():
    h = History(sample_s=1.0, history_s=60)
    for i in range(500):
        h.add(raw(_snap(i, 10 * i, 10 * i, {1: i}), None, float(i)))
    series = h.series()
    assert len(series["t"]) == 60 and series["t"][0] == 440.0 and series["t"][-1] == 499.0
    assert len(h._raw) <= 31  # the raw samples of the 30 s window, no more
    assert series["accounting"]["applied"][-1] == pytest.approx(10.0)  # (4990 - 4690) / 30 s
    assert set(series["unaccounted"]) == {0}
    assert list(series["lag"]) == ["p0", "p1"]
    assert list(series) >= [p[0] for p in PANELS]  # every panel has its columns


def test_the_exporter_serves_the_page_its_data_its_assets_and_metrics():
    from prometheus_client import CollectorRegistry, Counter, make_wsgi_app

    from infra.stack import free_port_block

    registry = CollectorRegistry()
    Counter("probe", "a probe", registry=registry).inc()
    h = History(2.0, 900)
    h.add(raw(_snap(1, 0, 0, {}), None, 1.0))
    port = free_port_block(1)
    server = dashboard.serve(dashboard.wsgi_app(h, make_wsgi_app(registry), 2.0), "127.0.0.1", port)
    try:

        def get(path: str) -> tuple[str, bytes]:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as a:
                return a.headers["Content-Type"], a.read()

        ctype, page = get("/dashboard")
        assert ctype.startswith("text/html")
        for pid, title, *_ in PANELS:
            assert f"data-panel='{pid}'" in page.decode() and title.replace(">", "&gt;") in page.decode()
        assert b"/dashboard/static/uPlot.iife.min.js" in page and b"setInterval(refresh, 2000)" in page
        assert json.loads(get("/dashboard/data.json")[1])["t"] == [1.0]
        assert get("/dashboard/static/uPlot.iife.min.js")[1].startswith(
            b"/*! https://github.com/leeoniya/uPlot"
        )
        assert b"probe_total 1.0" in get("/metrics")[1]
        assert get("/")[0].startswith("text/html")  # redirected to the page
    finally:
        server.shutdown()


def test_the_vendored_uplot_is_the_npm_tarballs(tmp_path):
    manifest = json.loads((dashboard.UPLOT / "vendor.json").read_text())
    assert (manifest["package"], manifest["registry"], manifest["license"]) == ("uplot", "npm", "MIT")
    assert manifest["integrity"].startswith("sha512-")
    assert dashboard.vendored_problems() == []
    copy = tmp_path / "uplot"
    shutil.copytree(dashboard.UPLOT, copy)
    (copy / "uPlot.iife.min.js").write_text("/* changed by hand */")
    assert dashboard.vendored_problems(copy) == [
        f"uPlot.iife.min.js: not package/dist/uPlot.iife.min.js of {manifest['tarball']} (sha256 differs)"
    ]


def test_the_vendoring_refuses_a_tarball_that_is_not_the_registrys(tmp_path):
    tarball = tmp_path / "uplot-9.9.9.tgz"
    tarball.write_bytes(b"not the registry's")
    with pytest.raises(ValueError, match="integrity"):
        dashboard.vendor(tarball, "sha512-AAAA", tmp_path)


# --- Grafana's dashboard ----------------------------------------------------------------------------


def test_grafanas_dashboard_is_the_one_the_code_writes():
    assert GRAFANA_DASHBOARD.read_text() == dashboard.grafana_json(), (
        "infra/grafana/dashboards/social.json is stale: "
        "python -c 'from pipelines.dashboard import *; GRAFANA_DASHBOARD.write_text(grafana_json())'"
    )


def test_grafana_has_the_pages_panels_on_the_provisioned_data_source():
    board = json.loads(GRAFANA_DASHBOARD.read_text())
    assert [p["title"] for p in board["panels"]] == [title for _, title, *_ in PANELS]
    source = (REPO_ROOT / "infra" / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    assert f"uid: {dashboard.GRAFANA_DATASOURCE['uid']}" in source and "url: http://prometheus:9090" in source
    for panel in board["panels"]:
        assert panel["datasource"] == dashboard.GRAFANA_DATASOURCE and panel["targets"], panel["title"]


def _documented_metrics() -> set[str]:
    text = (REPO_ROOT / "docs" / "metrics.md").read_text()
    return {m.removesuffix("_total") for m in re.findall(r"^\| `(social_[a-z_]+)` \|", text, re.M)}


def test_every_grafana_query_reads_metrics_the_project_exports():
    documented = _documented_metrics()
    assert {"social_serving_lag_records", "social_api_request_seconds"} <= documented
    for pid, queries in GRAFANA_QUERIES.items():
        for expr, *_ in queries:
            for name in re.findall(r"social_[a-z_]+", expr):
                base = re.sub(r"_(bucket|total)$", "", name)
                assert base in documented, f"{pid}: {expr} reads {name}, which docs/metrics.md does not list"


@pytest.mark.skipif(
    binary("promtool") is None, reason="no promtool: SOCIAL_PROMETHEUS=1 make setup fetches it"
)
def test_every_grafana_query_is_promql_promtool_accepts(tmp_path):
    rules = tmp_path / "panels.yml"
    lines = ["groups:", "  - name: grafana_panels", "    rules:"]
    for pid, queries in GRAFANA_QUERIES.items():
        for i, (expr, *_rest) in enumerate(queries):
            lines += [f"      - record: panel:{pid}:{i}", f"        expr: {json.dumps(expr)}"]
    rules.write_text("\n".join(lines) + "\n")
    done = subprocess.run(
        [str(binary("promtool")), "check", "rules", str(rules)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {sum(map(len, GRAFANA_QUERIES.values()))} rules found" in done.stdout
    rules.write_text(rules.read_text().replace("[30s]", "[30s", 1))  # promtool really refuses
    assert subprocess.run(
        [str(binary("promtool")), "check", "rules", str(rules)], capture_output=True
    ).returncode
