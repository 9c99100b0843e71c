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
    "streams": {
        # the shape of Spark's StreamingQueryProgress.json for a Kafka source (trimmed)
        "keyed_v1": {
            "name": "keyed_v1",
            "timestamp": "1970-01-01T00:16:55.000Z",  # 1015 s: 15 s before "now"
            "batchId": 42,
            "numInputRows": 384,
            "inputRowsPerSecond": 1900.5,
            "processedRowsPerSecond": 2100.0,
            "batchDuration": 183,
            "sources": [
                {
                    "description": "KafkaV2[Subscribe[social.events]]",
                    "startOffset": {"social.events": {"0": 80, "1": 40}},
                    "endOffset": {"social.events": {"0": 90, "1": 50}},
                    "latestOffset": {"social.events": {"0": 100, "1": 50}},
                }
            ],
        }
    },
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


def test_the_streaming_queries_progress_is_exported_per_query_and_partition():
    text = exported()
    assert 'social_stream_input_rows_per_second{query="keyed_v1"} 1900.5' in text
    assert 'social_stream_processed_rows_per_second{query="keyed_v1"} 2100.0' in text
    assert 'social_stream_batch_duration_seconds{query="keyed_v1"} 0.183' in text
    assert 'social_stream_input_rows{query="keyed_v1"} 384.0' in text
    assert 'social_stream_batch_id{query="keyed_v1"} 42.0' in text
    assert 'social_stream_progress_age_seconds{query="keyed_v1"} 15.0' in text
    lag = 'social_stream_partition_lag_records{{partition="{}",query="keyed_v1",topic="social.events"}} {}'
    assert lag.format(0, "10.0") in text and lag.format(1, "0.0") in text


def test_a_progress_file_keeps_each_querys_latest_report(tmp_path):
    import json

    from pipelines.stream_progress import ProgressFile, partition_lag, read

    keep = ProgressFile(tmp_path / "progress")
    first = {**SNAP["streams"]["keyed_v1"], "batchId": 41}
    keep.write(json.dumps(first))
    keep.write(json.dumps(SNAP["streams"]["keyed_v1"]))
    keep.write(json.dumps({"name": "events", "batchId": 3, "sources": []}))
    assert keep.write(json.dumps({"name": None, "batchId": 1})) is None  # an unnamed query: no file
    found = read(tmp_path / "progress")
    assert sorted(found) == ["events", "keyed_v1"]
    assert found["keyed_v1"]["batchId"] == 42  # the latest report, replaced whole
    assert partition_lag(found["keyed_v1"]) == {("social.events", 0): 10, ("social.events", 1): 0}
    assert sorted(p.name for p in (tmp_path / "progress").iterdir()) == ["events.json", "keyed_v1.json"]
    assert read(tmp_path / "nothing") == {}


def test_make_up_starts_the_exporter_which_answers_while_the_stores_are_away(tmp_path):
    """The service `make up` starts (infra.services.MetricsExporter), for real: ready when /metrics
    answers, at once, with social_exporter_up 0 while no Kafka or Redis listens; stopped by pid."""
    import time
    import urllib.request

    from infra.services import SERVICES, ApiServer, MetricsExporter
    from infra.settings import get_settings
    from infra.stack import free_port_block, port_listening

    assert SERVICES.index(MetricsExporter) == SERVICES.index(ApiServer) + 1
    kafka, redis, port = (free_port_block(1) for _ in range(3))
    settings = get_settings(
        var_dir=tmp_path,
        metrics_port=port,
        kafka_bootstrap=f"127.0.0.1:{kafka}",
        redis_url=f"redis://127.0.0.1:{redis}/0",
    )
    exporter = MetricsExporter(settings)
    try:
        assert exporter.start() == "started"
        started = time.monotonic()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
        assert time.monotonic() - started < 2
        assert "social_exporter_up 0.0" in text
        assert exporter.start() == "already running"
    finally:
        assert exporter.stop() == "stopped"
    assert not port_listening(port)
