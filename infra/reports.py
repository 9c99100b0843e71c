"""``var/reports/index.html``: one page linking every report, with its time and verdict.

``python -m infra.reports`` (``make reports``) rebuilds it; ``make load``, ``pipelines.quality``
and the demo rebuild it after writing theirs. Each report is found by its machine-readable file;
the verdict is the report's own (``ok`` / the load test's target), the time its ``generated_at``
or, when it has none, the file's modification time (UTC).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from infra.cli import command_name, run_main
from infra.html import render
from infra.settings import Settings, get_settings

# name, machine-readable file, page a person opens (relative to the reports dir), verdict of the JSON
REPORTS: tuple[tuple[str, str, str, Callable[[dict], Any]], ...] = (
    ("verify", "verify/latest.json", "verify/latest.html", lambda r: r.get("ok")),
    ("data quality", "quality/latest.json", "quality/index.html", lambda r: r.get("ok")),
    ("load test", "load/summary.json", "load/report.html", lambda r: (r.get("target") or {}).get("met")),
    ("step load", "load/summary.json", "load/steps.html", lambda r: r.get("target_holds_up_to_users")),
    ("stream analytics", "analytics/summary.json", "analytics/index.html", lambda r: None),
    ("benchmarks", "bench/latest.json", "bench/latest.json", lambda r: None),
    ("dual writes vs. the log", "dual_write/latest.json", "dual_write/latest.html", lambda r: None),
)


def _verdict(value) -> tuple[str, str]:
    if value is True:
        return "ok", "ok"
    if value is False:
        return "FAILED", "bad"
    if value is None:
        return "-", "muted"
    return f"holds up to {value} users", "muted"


def entries(reports_dir: Path) -> list[dict]:
    """The reports that exist, in the order of REPORTS."""
    out = []
    for name, data, page, verdict in REPORTS:
        data_path, page_path = reports_dir / data, reports_dir / page
        if not data_path.exists() or not page_path.exists():
            continue
        try:
            report = json.loads(data_path.read_text())
        except ValueError:
            report = {}
        when = report.get("generated_at") or datetime.fromtimestamp(data_path.stat().st_mtime, UTC).isoformat(
            timespec="seconds"
        )
        out.append({"name": name, "href": page, "time": when, "verdict": verdict(report)})
    return out


def write_index(settings: Settings | None = None) -> Path:
    settings = settings or get_settings()
    reports_dir = Path(settings.reports_dir)
    reports_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for e in entries(reports_dir):
        text, css = _verdict(e["verdict"])
        rows.append(
            {"href": e["href"], "name": e["name"], "time": str(e["time"]), "verdict": text, "css": css}
        )
    page = render("reports_index.html.j2", rows=rows, dashboard=settings.dashboard_url)
    index = reports_dir / "index.html"
    tmp = index.with_suffix(".tmp")
    tmp.write_text(page)
    tmp.replace(index)
    return index


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(
        prog=command_name("infra.reports"), description=__doc__.splitlines()[0]
    ).parse_args(argv)
    print(write_index())
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "infra.reports"))
