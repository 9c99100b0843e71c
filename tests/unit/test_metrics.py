"""The live metrics (pipelines/metrics.py) from one snapshot of the stores: every metric docs/metrics.md
lists is exported, lags are log end minus position, the freshness histogram is cumulative."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, generate_latest

from infra.settings import REPO_ROOT
from pipelines.metrics import families, summary

SNAP = {
    "namespace": "v1",
    "topic": "social.events",
    "end": {0: 100, 1: 50},
    "fence": {0: 90, 1: 50},
    "archive": {0: 60, 1: 40},
    "archived_at": 1000.0,
    "stats": {0: {"applied": 85, "duplicates": 2, "quarantined": 3}, 1: {"applied": 50}},
    "freshness": {3: 5, 40: 4, 12000: 1},  # 10 ms buckets: 30-40 ms, 400-410 ms, the 120 s cap
    "bucket_ms": 10,
    "fcall_calls": 10,
    "fcall_usec": 14_000,
    "redis_us_per_event": 100.0,
    "now": 1030.0,
}


def documented() -> tuple[set[str], set[str]]:
    """The metric names docs/metrics.md's tables list: the exporter's, and the API's (its section)."""
    text = (REPO_ROOT / "docs" / "metrics.md").read_text()
    exporter, api = text.split("\n## The API", 1)
    names = re.compile(r"^\| `(social_[a-z_]+)`", re.M)
    return set(names.findall(exporter)), set(names.findall(api))


def test_every_metric_of_the_api_is_documented_in_its_section():
    from app_sim.api.metrics import ApiMetrics

    text = generate_latest(ApiMetrics().registry).decode()
    assert documented()[1] == set(re.findall(r"^# TYPE (social_[a-z_]+) ", text, re.M))


def exported() -> str:
    class One:
        def collect(self):
            yield from families(SNAP)

    registry = CollectorRegistry()
    registry.register(One())
    return generate_latest(registry).decode()


def test_every_documented_metric_is_exported_and_lags_are_end_minus_position():
    text = exported()
    exporter_docs, _ = documented()
    names = set(re.findall(r"^# TYPE (social_[a-z_]+) ", text, re.M)) | {"social_exporter_up"}
    assert exporter_docs == names
    assert 'social_serving_lag_records{namespace="v1",partition="0"} 10.0' in text
    assert 'social_archive_lag_records{namespace="v1",partition="0"} 40.0' in text
    assert 'social_archive_behind_serving_records{namespace="v1",partition="1"} 10.0' in text
    assert 'social_events_total{disposition="quarantined",namespace="v1",partition="0"} 3.0' in text
    assert 'social_freshness_seconds_bucket{le="0.05",namespace="v1"} 5.0' in text
    assert 'social_freshness_seconds_bucket{le="0.5",namespace="v1"} 9.0' in text
    assert 'social_freshness_seconds_bucket{le="+Inf",namespace="v1"} 10.0' in text
    assert 'social_archive_age_seconds{namespace="v1"} 30.0' in text


def test_the_summary_names_both_lags_and_the_freshness():
    text = summary(SNAP)
    assert "serving path (Redis fences) 140, lag 10 records" in text
    assert "archive (Delta) 100, lag 50 records (last commit 30s ago)" in text
    assert "p50 40 ms, p99 120010 ms over 10 events" in text and "100 µs of Redis per event" in text
