"""The live dashboard: the exporter's ``/dashboard``, plots of the last minutes a person looks at.

The metrics exporter (:mod:`pipelines.metrics`) serves ``/metrics`` statelessly; for a person
without a Prometheus it also keeps a bounded history: every ``SOCIAL_DASHBOARD_SAMPLE_S`` (2 s) a
sampler thread reads the same snapshot a scrape reads, plus the app API's own ``/metrics``, and
appends one point to a ring buffer of ``SOCIAL_DASHBOARD_HISTORY_S`` (15 min). ``/dashboard`` is a
page of five plots (uPlot, vendored from npm: ``pipelines/static/uplot/``), fed by
``/dashboard/data.json`` and redrawn at each point:

- serving lag per partition (records: log end - the speed layer's fence);
- freshness p50 / p99 (server receive -> applied in Redis) over the last ``WINDOW_S``;
- the archive's lag: records the Delta views do not cover, behind the log's end and behind the
  speed layer's fences (its age, seconds since its last commit, beside the plot);
- the API's request rate (requests/s, its own ``/metrics`` scrapes excluded) and p99 latency;
- the accounting: records decided per second by disposition (applied, duplicates, rejected,
  quarantined), with the totals and ``unaccounted`` (records read - records decided) beside it.

The same panels, as PromQL over the Prometheus that scrapes the exporter: Grafana's dashboard
``infra/grafana/dashboards/social.json`` (docker-compose.yml's ``grafana``). Each panel's
``data-points`` attribute is the number of points its sparsest series has, so a browser test can
read what was drawn (tests/integration/test_dashboard.py).

Windowed figures (rates, quantiles) compare the newest sample with the one ``WINDOW_S`` before it,
as Prometheus's ``rate(...[30s])`` does; a figure with nothing in its window is ``null`` (a gap).
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra.settings import REPO_ROOT

STATIC = Path(__file__).resolve().parent / "static"
WINDOW_S = 30.0
DISPOSITIONS = ("applied", "duplicates", "rejected", "quarantined")
# (id, title, unit of the left axis, unit of the right axis or None): the page's panels, and Grafana's
PANELS = (
    ("lag", "Serving lag per partition", "records", None),
    ("freshness", "Freshness p50 / p99 (received -> visible in Redis)", "s", None),
    ("archive", "Archive lag (Delta views behind the log and behind Redis)", "records", None),
    ("api", "API request rate and p99 latency", "req/s", "ms"),
    ("accounting", "Accounting: records decided per second", "records/s", None),
)


# The same panels for Grafana (docker-compose.yml's `grafana`, over the Prometheus that scrapes the
# exporter and the API every 5 s): panel id -> [(PromQL, legend, unit, on the right axis)]. The windows
# are the page's 30 s; `route!="/metrics"` leaves Prometheus's own scrapes of the API out, as the page
# leaves the exporter's out.
GRAFANA_QUERIES: dict[str, list[tuple[str, str, str, bool]]] = {
    "lag": [("social_serving_lag_records", "{{namespace}} p{{partition}}", "short", False)],
    "freshness": [
        (
            f"histogram_quantile({q}, sum by (namespace, le) (rate(social_freshness_seconds_bucket[30s])))",
            f"p{round(q * 100)} {{{{namespace}}}}",
            "s",
            False,
        )
        for q in (0.5, 0.99)
    ],
    "archive": [
        ("sum by (namespace) (social_archive_lag_records)", "behind the log {{namespace}}", "short", False),
        (
            "sum by (namespace) (social_archive_behind_serving_records)",
            "behind Redis {{namespace}}",
            "short",
            False,
        ),
    ],
    "api": [
        ('sum(rate(social_api_requests_total{route!="/metrics"}[30s]))', "requests/s", "reqps", False),
        (
            "histogram_quantile(0.99, sum by (le) "
            '(rate(social_api_request_seconds_bucket{route!="/metrics"}[30s])))',
            "p99",
            "s",
            True,
        ),
    ],
    "accounting": [
        ("sum by (disposition) (rate(social_events_total[30s]))", "{{disposition}}", "short", False)
    ],
}
GRAFANA_DASHBOARD = REPO_ROOT / "infra" / "grafana" / "dashboards" / "social.json"
GRAFANA_DATASOURCE = {"type": "prometheus", "uid": "social-prometheus"}  # infra/grafana/provisioning


def grafana_dashboard() -> dict:
    """The dashboard Grafana provisions (infra/grafana/dashboards/social.json): PANELS, two a row."""
    panels = []
    for n, (pid, title, _left, _right) in enumerate(PANELS):
        queries = GRAFANA_QUERIES[pid]
        overrides = [
            {
                "matcher": {"id": "byName", "options": legend},
                "properties": [
                    {"id": "custom.axisPlacement", "value": "right"},
                    {"id": "unit", "value": unit},
                ],
            }
            for _expr, legend, unit, right in queries
            if right
        ]
        panels.append(
            {
                "id": n + 1,
                "type": "timeseries",
                "title": title,
                "datasource": GRAFANA_DATASOURCE,
                "gridPos": {"h": 9, "w": 12, "x": 12 * (n % 2), "y": 9 * (n // 2)},
                "fieldConfig": {
                    "defaults": {"unit": queries[0][2], "custom": {"lineWidth": 1, "showPoints": "never"}},
                    "overrides": overrides,
                },
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
                "targets": [
                    {
                        "refId": chr(ord("A") + i),
                        "datasource": GRAFANA_DATASOURCE,
                        "expr": expr,
                        "legendFormat": legend,
                    }
                    for i, (expr, legend, _unit, _right) in enumerate(queries)
                ],
            }
        )
    return {
        "uid": "kappa-social-live",
        "title": "kappa-social: live health",
        "description": "The panels of the metrics exporter's /dashboard (pipelines/dashboard.py), from Prometheus",
        "tags": ["kappa-social"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "5s",
        "time": {"from": "now-15m", "to": "now"},
        "panels": panels,
    }


def grafana_json() -> str:
    return json.dumps(grafana_dashboard(), indent=2) + "\n"


# --- one sample -----------------------------------------------------------------------------------


def hist_quantile(hist: dict[int, int], bucket_ms: int, q: float) -> float | None:
    """The q-quantile (seconds) of the speed layer's freshness histogram (bucket b: [b, b+1) * bucket_ms),
    as the upper bound of the bucket it falls in; None for an empty histogram."""
    total = sum(hist.values())
    if total <= 0:
        return None
    acc = 0
    for b in sorted(hist):
        acc += hist[b]
        if acc >= q * total:
            return (b + 1) * bucket_ms / 1000
    return None


def le_quantile(buckets: dict[float, float], q: float) -> float | None:
    """Prometheus's ``histogram_quantile``: cumulative counts by upper bound ``le`` (``inf`` last),
    linear within the bucket the rank falls in; None when nothing was counted."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for le in bounds:
        count = buckets[le]
        if count >= rank:
            if math.isinf(le):
                return lower  # the highest finite bound, as Prometheus answers
            if count == below:
                return le
            return lower + (le - lower) * (rank - below) / (count - below)
        lower, below = le, count
    return lower


def api_counters(text: str) -> dict:
    """From the API's /metrics text: requests answered and the latency histogram (cumulative by
    ``le``), summed over routes and methods, the scrapes of ``/metrics`` itself left out."""
    from prometheus_client.parser import text_string_to_metric_families

    requests = 0.0
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("route") == "/metrics":
                continue
            if s.name == "social_api_requests_total":
                requests += s.value
            elif s.name == "social_api_request_seconds_bucket":
                le = float(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + s.value
    return {"requests": requests, "buckets": buckets}


def read_api(url: str, timeout_s: float = 2.0) -> dict | None:
    """The API's counters, or None when it does not answer (no API running: its plot has a gap)."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/metrics", timeout=timeout_s) as answer:
            return api_counters(answer.read().decode())
    except (OSError, ValueError):
        return None


def raw(snap: dict | None, api: dict | None, now: float) -> dict:
    """What one sample keeps to compute its point and the points after it (cumulative counters)."""
    out: dict = {"t": now, "api": api}
    if snap is not None:
        out |= {
            "end": snap["end"],
            "fence": snap["fence"],
            "archive": snap["archive"],
            "archived_at": snap["archived_at"],
            "decided": {d: sum(s.get(d, 0) for s in snap["stats"].values()) for d in DISPOSITIONS},
            "freshness": dict(snap["freshness"]),
            "bucket_ms": snap["bucket_ms"],
            "namespace": snap["namespace"],
        }
    return out


def point(cur: dict, old: dict | None) -> dict:
    """One point of every series: levels from ``cur``, rates and quantiles over ``old`` -> ``cur``."""
    p: dict = {"t": round(cur["t"], 3)}
    dt = cur["t"] - old["t"] if old else 0.0
    if "end" in cur:
        end, fence, archive = cur["end"], cur["fence"], cur["archive"]
        p["lag"] = {str(k): max(0, end[k] - fence.get(k, 0)) for k in sorted(end)}
        p["archive_lag"] = sum(max(0, end[k] - archive.get(k, 0)) for k in end)
        p["archive_behind"] = sum(max(0, fence.get(k, 0) - archive.get(k, 0)) for k in end)
        p["archive_age_s"] = (
            round(max(0.0, cur["t"] - cur["archived_at"]), 1) if cur["archived_at"] is not None else None
        )
        decided = cur["decided"]
        p["decided"] = decided
        p["unaccounted"] = sum(fence.values()) - sum(decided.values())
        if old and "end" in old and dt > 0 and old["namespace"] == cur["namespace"]:
            p["rates"] = {d: round(max(0, decided[d] - old["decided"][d]) / dt, 2) for d in DISPOSITIONS}
            window = {
                b: n - old["freshness"].get(b, 0)
                for b, n in cur["freshness"].items()
                if n > old["freshness"].get(b, 0)
            }
            for q in (0.5, 0.99):
                p[f"fresh_p{round(q * 100)}"] = hist_quantile(window, cur["bucket_ms"], q)
    api, old_api = cur.get("api"), (old or {}).get("api")
    if api is not None and old_api is not None and dt > 0 and api["requests"] >= old_api["requests"]:
        p["api_rps"] = round((api["requests"] - old_api["requests"]) / dt, 2)
        window = {le: n - old_api["buckets"].get(le, 0.0) for le, n in api["buckets"].items()}
        p99 = le_quantile(window, 0.99)
        p["api_p99_ms"] = None if p99 is None else round(p99 * 1000, 2)
    return p


# --- the ring buffer --------------------------------------------------------------------------------


class History:
    """The last ``history_s`` of points, one per ``sample_s``: a ring buffer (``deque(maxlen)``), so
    the exporter's memory stays bounded however long it runs."""

    def __init__(self, sample_s: float, history_s: float):
        self.sample_s = sample_s
        self.capacity = max(2, int(history_s / sample_s))  # points kept
        self.points: deque[dict] = deque(maxlen=self.capacity)
        self._raw: deque[dict] = deque(maxlen=max(2, int(WINDOW_S / sample_s) + 1))
        self._lock = threading.Lock()

    def add(self, sample: dict) -> dict:
        """Append a raw sample; its point compares it with the oldest sample of the last WINDOW_S."""
        with self._lock:
            old = next((r for r in self._raw if sample["t"] - r["t"] <= WINDOW_S + self.sample_s / 2), None)
            p = point(sample, old)
            self._raw.append(sample)
            self.points.append(p)
            return p

    def series(self) -> dict:
        """The history as uPlot's columns: ``t`` (epoch s) and one list per series (None: a gap)."""
        with self._lock:
            points = list(self.points)
        partitions = sorted({k for p in points for k in p.get("lag", {})}, key=int)

        # get(point), or get(point, k) with a default k bound per series
        def col(get: Callable[..., float | None]) -> list:
            return [get(p) for p in points]

        out: dict[str, Any] = {
            "t": col(lambda p: p["t"]),
            "lag": {f"p{k}": col(lambda p, k=k: p.get("lag", {}).get(k)) for k in partitions},
            "freshness": {
                "p50 (s)": col(lambda p: p.get("fresh_p50")),
                "p99 (s)": col(lambda p: p.get("fresh_p99")),
            },
            "archive": {
                "behind the log": col(lambda p: p.get("archive_lag")),
                "behind Redis": col(lambda p: p.get("archive_behind")),
            },
            "api": {
                "requests/s": col(lambda p: p.get("api_rps")),
                "p99 (ms)": col(lambda p: p.get("api_p99_ms")),
            },
            "accounting": {d: col(lambda p, d=d: (p.get("rates") or {}).get(d)) for d in DISPOSITIONS},
        }
        last = next((p for p in reversed(points) if "decided" in p), None)
        out["totals"] = (
            {"decided": last["decided"], "unaccounted": last["unaccounted"]} if last is not None else None
        )
        out["unaccounted"] = col(lambda p: p.get("unaccounted"))
        out["archive_age_s"] = last.get("archive_age_s") if last is not None else None
        out["sample_s"] = self.sample_s
        return out


class Sampler(threading.Thread):
    """Adds a point to ``history`` every ``history.sample_s``, read by ``read_snapshot`` and
    ``read_api``; a sample whose stores do not answer is a point of gaps, never a crash."""

    def __init__(
        self,
        history: History,
        read_snapshot: Callable[[], dict],
        api_url: str | None,
    ):
        super().__init__(name="dashboard-sampler", daemon=True)
        self.history, self.read_snapshot, self.api_url = history, read_snapshot, api_url
        self.stopped = threading.Event()
        self.failing: str | None = None  # the last failure, said once (not every sample)

    def sample(self) -> dict:
        try:
            snap = self.read_snapshot()
            if self.failing is not None:
                print("dashboard samples: the stores answer again", file=sys.stderr, flush=True)
            self.failing = None
        except Exception as exc:  # noqa: BLE001 - a store away is a gap on the plots, not a dead exporter
            if str(exc) != self.failing:
                print(f"dashboard samples: gaps while {exc}", file=sys.stderr, flush=True)
            self.failing, snap = str(exc), None
        api = read_api(self.api_url) if self.api_url else None
        return self.history.add(raw(snap, api, time.time()))

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.stopped.is_set():
            self.sample()
            next_at += self.history.sample_s
            self.stopped.wait(max(0.0, next_at - time.monotonic()))


# --- the page -------------------------------------------------------------------------------------


def page(history: History, refresh_s: float) -> str:
    from infra.html import render

    return render(
        "dashboard.html.j2",
        panels=[{"id": i, "title": t, "left": left, "right": right} for i, t, left, right in PANELS],
        refresh_ms=int(refresh_s * 1000),
        history_min=round(history.capacity * history.sample_s / 60, 1),
    )


def wsgi_app(history: History, metrics_app, refresh_s: float):
    """``/metrics`` (prometheus-client's app), ``/dashboard``, its data and its vendored assets."""
    assets = {
        "/dashboard/static/uPlot.iife.min.js": ("uplot/uPlot.iife.min.js", "application/javascript"),
        "/dashboard/static/uPlot.min.css": ("uplot/uPlot.min.css", "text/css"),
    }

    def app(environ, start_response):
        path = environ.get("PATH_INFO", "/")
        if path in ("/dashboard", "/dashboard/"):
            body, ctype = page(history, refresh_s).encode(), "text/html; charset=utf-8"
        elif path == "/dashboard/data.json":
            body, ctype = json.dumps(history.series()).encode(), "application/json"
        elif path in assets:
            name, ctype = assets[path]
            body = (STATIC / name).read_bytes()
        elif path == "/":
            start_response("302 Found", [("Location", "/dashboard")])
            return [b""]
        else:
            return metrics_app(environ, start_response)
        start_response("200 OK", [("Content-Type", ctype), ("Cache-Control", "no-store")])
        return [body]

    return app


def serve(app, host: str, port: int):
    """A threaded WSGI server (the standard library's, as prometheus-client's own is) in a daemon thread."""
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        allow_reuse_address = True

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args):  # one line per scrape would fill the log
            pass

    server = make_server(host, port, app, server_class=Server, handler_class=Quiet)
    threading.Thread(target=server.serve_forever, name="exporter-http", daemon=True).start()
    return server


# --- the vendored plotting library ----------------------------------------------------------------

UPLOT = STATIC / "uplot"


def vendored_problems(directory: Path = UPLOT) -> list[str]:
    """What differs between the vendored uPlot files and their manifest (vendor.json: each file's
    sha256, taken from the npm tarball whose integrity the manifest records); [] when they agree."""
    import hashlib

    manifest = json.loads((directory / "vendor.json").read_text())
    problems = []
    for member, entry in manifest["files"].items():
        path = directory / entry["as"]
        if not path.exists():
            problems.append(f"{entry['as']}: missing ({member} of {manifest['tarball']})")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != entry["sha256"]:
            problems.append(f"{entry['as']}: not {member} of {manifest['tarball']} (sha256 differs)")
    return problems


def vendor(tarball: Path, integrity: str, directory: Path = UPLOT) -> dict:
    """Vendor uPlot from an npm tarball (``npm pack uplot@VERSION``) whose sha512 is ``integrity``
    (``npm view uplot@VERSION dist.integrity``): copy its files, rewrite vendor.json."""
    import base64
    import hashlib
    import tarfile

    data = tarball.read_bytes()
    got = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    if got != integrity:
        raise ValueError(f"{tarball.name}: integrity {got}, the registry says {integrity}")
    manifest = json.loads((directory / "vendor.json").read_text())
    with tarfile.open(tarball) as tar:

        def extract(member: str) -> bytes:
            f = tar.extractfile(member)
            if f is None:  # a directory or a link
                raise ValueError(f"{tarball.name}: {member} is not a file")
            return f.read()

        version = json.loads(extract("package/package.json"))["version"]
        for member, entry in manifest["files"].items():
            content = extract(member)
            (directory / entry["as"]).write_bytes(content)
            entry["sha256"] = hashlib.sha256(content).hexdigest()
    manifest |= {"version": version, "tarball": tarball.name, "integrity": integrity}
    (directory / "vendor.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
