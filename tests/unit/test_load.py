"""make load's verdict and step-load table, from Locust's own numbers (worked out by hand)."""

from __future__ import annotations

import csv

from app_sim.load import step_table, target_misses

SUMMARY = {"requests": 1000, "failures": 20, "reads": {"requests": 900, "p99_ms": 80.0}}


def test_target_misses_name_each_missed_bound():
    assert target_misses(SUMMARY, max_read_p99_ms=50, max_fail_ratio=0.01) == [
        "reads p99 80 ms > 50 ms",
        "failure ratio 0.0200 > 0.01",
    ]
    assert target_misses(SUMMARY, max_read_p99_ms=100, max_fail_ratio=0.05) == []
    assert target_misses(SUMMARY, max_read_p99_ms=0, max_fail_ratio=1.0) == []  # 0 / 1: no check


def test_step_table_takes_each_steps_settled_median(tmp_path):
    # two 4-second steps; the first second of each (a quarter: the spawn) is left out
    history = tmp_path / "load_stats_history.csv"
    points = [  # (second, users, requests/s, p99)
        (0, 5, 10, 900), (1, 10, 40, 20), (2, 10, 42, 30), (3, 10, 44, 40),
        (4, 15, 50, 999), (5, 20, 60, 70), (6, 20, 62, 80), (7, 20, 64, 90),
    ]  # fmt: skip
    with history.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Timestamp", "User Count", "Type", "Name", "Requests/s", "99%"])
        for t, users, rps, p99 in points:
            w.writerow([1000 + t, users, "", "Aggregated", rps, p99])
            w.writerow([1000 + t, users, "GET", "/v1/timeline", 1, 1])  # per endpoint: not used
    assert step_table(history, step_seconds=4, max_read_p99_ms=50) == [
        {"step": 1, "users": 10, "per_s": 42.0, "p99_ms": 30.0, "within_target": True},
        {"step": 2, "users": 20, "per_s": 62.0, "p99_ms": 80.0, "within_target": False},
    ]
