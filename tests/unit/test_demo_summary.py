"""The demo's summary from what it measured (stories/demo.py): the serving path's freshness over the
live part only, every comparison of the verify report counted, a history that ends before now."""

from __future__ import annotations

from stories.demo import covered, histogram_since, history_config, mismatches, percentiles


def test_freshness_counts_only_the_events_since_the_history():
    before = {12000: 6000}  # the simulated-clock history: every delay at the 120 s cap
    now = {12000: 6000, 3: 40, 50: 9, 90: 1}
    since = histogram_since(now, before)
    assert since == {3: 40, 50: 9, 90: 1}
    assert percentiles(since, 10) == {"events": 50, "p50_ms": 40, "p99_ms": 910, "max_ms": 910}
    assert percentiles({}, 10) == {"events": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}


def test_every_comparison_of_the_verify_report_is_counted():
    report = {
        "views": {"a": {"mismatches": 0}, "b": {"mismatches": 0}},
        "serving": {"ok": True, "home_timeline": {"mismatches": 0}, "unread_counts": {"mismatches": 0}},
        "keyed": {"ok": False, "mismatches": 43},  # the comparison tables that say ok used to hide
        "batch_layer": {"ok": None, "skipped": "the archive is behind the live state"},
    }
    assert mismatches(report) == {
        "Delta views vs recomputed": 0,
        "Redis vs Delta": 0,
        "keyed state vs replay": 43,
        "keyed state vs batch layer": None,
    }


def test_the_history_ends_before_now_at_the_worlds_pace():
    now = 1_800_000_000_000
    cfg = history_config(200, 20_000, 0.02, now)
    span_ms = 20_000 * 1000 / (0.02 * 200)
    assert cfg.sim_events_per_user_s == 0.02 and cfg.users == 200
    assert now - span_ms - 0.03 * span_ms - 60_000 < cfg.start_ms < now - span_ms  # ends ~a minute early


def test_covered_counts_up_to_each_partitions_end():
    assert covered({0: 5, 1: 30}, {0: 10, 1: 20, 2: 4}) == 5 + 20 + 0
