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


def test_the_accounting_line_says_mismatch_when_duplicates_differ_from_those_injected():
    """The demo fails unless the speed layer counted exactly the re-sends it injected (history's and
    live part's): here 3 counted against 2 + 1 injected, then against 2 + 0."""
    from types import SimpleNamespace as NS

    from infra.settings import get_settings
    from stories import demo

    history = NS(
        events=10,
        summary=NS(events_per_s=5.0, duplicates=2),
        config=NS(start_ms=1_780_000_000_000, users=3),
        now_ms=1_780_000_100_000,
        serving_s=1.0,
    )
    acct = {"events_read": 12, "applied": 9, "duplicates": 3, "rejected": 0, "quarantined": 0, "ok": True}
    o = demo.Outcome(
        history=history,  # type: ignore[arg-type]
        live=NS(events=2, duplicates=1),  # type: ignore[arg-type]
        injected=0,
        serving_s=0.5,
        archive_s=1.0,
        archive_history_s=2.0,
        fresh={"events": 0},
        verified=True,
        verify_s=1.0,
        quality_ok=None,
        quality_s=0.0,
        report={"ok": True, "views": {}, "keyed": {"accounting": acct}},
    )
    args = NS(live_seconds=5, events_per_user_s=1.0)
    line = dict(demo.summary_rows(args, get_settings(), o, 0.0))["accounting"]
    assert o.duplicates_as_injected and line.endswith("duplicates injected 3) -> ok"), line
    o.live = NS(events=2, duplicates=0)  # type: ignore[assignment]
    line = dict(demo.summary_rows(args, get_settings(), o, 0.0))["accounting"]
    assert not o.duplicates_as_injected and line.endswith("duplicates injected 2) -> MISMATCH"), line
