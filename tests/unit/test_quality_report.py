"""The verify report page (pipelines.report): a self-contained HTML page from the verify JSON."""

from __future__ import annotations

from pipelines.report import render, write_html

REPORT = {
    "ok": False,
    "namespace": "v1",
    "position": {"batch_id": 7, "end_offsets": {"0": 120, "1": 98}},
    "views": {
        "home_timeline": {
            "live_rows": 10,
            "recomputed_rows": 11,
            "mismatches": 1,
            "examples": [{"user_id": 3, "post_id": 9}],
            "ok": False,
        },
        "unread_counts": {"live_rows": 4, "recomputed_rows": 4, "mismatches": 0, "examples": [], "ok": True},
    },
    "serving": {"ok": True, "timelines_checked": 10},
    "accounting": {"events_read": 218, "applied": 200, "duplicates": 8, "quarantined": 10, "ok": True},
    "freshness": {"p50_ms": 800, "p99_ms": 2400},
    "generated_at": "2026-01-01T00:00:00Z",
}


def test_page_shows_verdict_views_and_embedded_plot():
    page = render(REPORT)
    assert "MISMATCH" in page
    assert "home_timeline" in page and "unread_counts" in page
    assert "data:image/png;base64," in page  # the freshness plot is embedded, not linked
    assert "<script" not in page


def test_write_html_is_atomic_and_escapes(tmp_path):
    report = {
        **REPORT,
        "ok": True,
        "namespace": "<v2>",
        "freshness": {"p50_ms": 900, "p99_ms": 1000},
    }
    out = write_html(report, tmp_path / "verify" / "latest.html")
    text = out.read_text()
    assert "&lt;v2&gt;" in text and "<v2>" not in text
    assert not list(out.parent.glob("*.tmp"))


def test_series_and_nested_serving_render():
    report = {
        **REPORT,
        "freshness": {
            "p50_ms": 900,
            "p99_ms": 2000,
            "series": [
                {"batch_id": 0, "visible_at": 1000, "max_delay_ms": 1500},
                {"batch_id": 1, "visible_at": 3000, "max_delay_ms": 2100},
            ],
        },
        "serving": {
            "unread_counts": {"live_rows": 4, "recomputed_rows": 4, "mismatches": 0, "ok": True},
            "ok": True,
        },
    }
    page = render(report)
    assert "data:image/png;base64," in page
    assert "rows in Redis" in page


def test_no_freshness_no_plot():
    page = render({**REPORT, "freshness": {}})
    assert "data:image/png" not in page


def test_the_page_leads_with_what_failed():
    """Tables that all say ok must not hide the comparison that failed further down: the verdict
    names it and the first section lists it, with its examples, before any table of views."""
    report = {
        **REPORT,
        "views": {"unread_counts": REPORT["views"]["unread_counts"]},  # every view ok
        "keyed": {
            "ok": False,
            "keys": 40,
            "mismatches": 2,
            "families": {
                "tl": {"keys": 10, "mismatches": 2, "ok": False, "examples": [{"key": "tl:7", "live": "a"}]},
                "fence": {"keys": 1, "mismatches": 0, "ok": True, "examples": []},
            },
            "freshness": {"events": 50, "p50_ms": 120, "p99_ms": 480, "max_ms": 600},
        },
        "batch_layer": {"ok": None, "skipped": "the archive is behind the live state"},
    }
    page = render(report)
    verdict = page.index("MISMATCH: keyed state vs. its replay")
    failed = page.index("What failed")
    assert verdict < failed < page.index("tl:7") < page.index("id='views'")
    assert "skipped: the archive is behind the live state" in page
    assert "data:image/png;base64," in page  # the serving path's freshness, even with one compaction
