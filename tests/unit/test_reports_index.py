"""var/reports/index.html links every report that exists, with its time and verdict."""

from __future__ import annotations

import json
import os

from infra.reports import write_index
from infra.settings import get_settings


def test_index_links_each_report_with_time_and_verdict(tmp_path):
    settings = get_settings(var_dir=tmp_path)
    r = settings.reports_dir
    for d in ("verify", "quality", "load"):
        (r / d).mkdir(parents=True)
    (r / "verify" / "latest.json").write_text(
        json.dumps({"ok": False, "generated_at": "2026-11-23T10:00:00+00:00"})
    )
    (r / "verify" / "latest.html").write_text("<html>")
    (r / "quality" / "latest.json").write_text(
        json.dumps({"ok": True, "generated_at": "2026-11-23T11:00:00+00:00"})
    )
    (r / "quality" / "index.html").write_text("<html>")
    (r / "load" / "summary.json").write_text(json.dumps({"target": {"met": True}}))
    os.utime(r / "load" / "summary.json", (1_767_225_600, 1_767_225_600))  # 2026-01-01T00:00:00Z
    (r / "load" / "report.html").write_text("<html>")  # no steps.html: no step-load row
    page = write_index(settings).read_text()
    rows = page.split("<tr>")[2:]
    assert [row.split("'")[1] for row in rows] == [
        "verify/latest.html",
        "quality/index.html",
        "load/report.html",
    ]
    assert "2026-11-23T10:00:00+00:00" in rows[0] and "FAILED" in rows[0]
    assert "2026-11-23T11:00:00+00:00" in rows[1] and ">ok<" in rows[1]
    assert "2026-01-01T00:00:00+00:00" in rows[2] and ">ok<" in rows[2]  # no generated_at: the file's time


def test_index_links_the_live_dashboard(tmp_path):
    settings = get_settings(var_dir=tmp_path, metrics_port=28464)
    page = write_index(settings).read_text()
    assert "href='http://127.0.0.1:28464/dashboard'" in page
    assert "no reports yet" in page  # the link is beside the table, not a report row
