"""The ``cluster_scaling`` bench's engines and ratios, worked out by hand (stories/bench_cluster.py)."""

from __future__ import annotations

from pathlib import Path

from infra.settings import get_settings
from infra.stack import standalone_spark_settings
from stories.bench_cluster import kafka_cluster_settings, scaling_ratios


def test_the_kafka_step_changes_only_kafka(tmp_path: Path):
    base = get_settings(profile="local", kafka_bootstrap="127.0.0.1:19092", spark_master="local[*]")
    s = kafka_cluster_settings(base, tmp_path)
    p = s.kafka_port
    # three nodes two ports apart (broker, controller), every one in the bootstrap list
    assert s.kafka_bootstrap == f"127.0.0.1:{p},127.0.0.1:{p + 2},127.0.0.1:{p + 4}"
    assert s.kafka_controller_port == p + 1
    assert (s.replication_factor, s.min_insync_replicas) == (3, 2)
    assert s.spark_master == "local[*]"  # Spark unchanged
    assert s.var_dir == tmp_path


def test_the_spark_step_changes_only_spark(tmp_path: Path):
    base = get_settings(profile="local", kafka_bootstrap="127.0.0.1:19092", spark_master="local[*]")
    for workers in (1, 2):
        s = standalone_spark_settings(base, tmp_path, workers)
        assert s.spark_master == f"spark://127.0.0.1:{s.spark_master_port}"
        assert s.spark_master_ui_port == s.spark_master_port + 1
        # one core per worker, the application may use them all, one task per core
        assert (s.spark_workers, s.spark_worker_cores, s.spark_app_cores, s.speed_tasks) == (
            workers, 1, workers, workers,
        )  # fmt: skip
        assert s.kafka_bootstrap == "127.0.0.1:19092"  # Kafka unchanged: the bench's one broker
        assert (s.broker_ports(), s.replication_factor) == (
            [(base.kafka_port, base.kafka_controller_port)],
            1,
        )


def test_each_step_is_a_ratio_of_two_configurations():
    results = {
        "1_broker_local": {"burst_applied_events_per_s": 4000, "freshness_p99_ms": 1000},
        "3_brokers_local": {"burst_applied_events_per_s": 3000, "freshness_p99_ms": 1500},
        "1_broker_1_worker": {"burst_applied_events_per_s": 2000, "freshness_p99_ms": 2000},
        "1_broker_2_workers": {"burst_applied_events_per_s": 3000, "freshness_p99_ms": None},
    }
    r = scaling_ratios(results)
    assert r["throughput_3_brokers_over_1"] == 0.75  # 3000 / 4000
    assert r["freshness_p99_3_brokers_over_1"] == 1.5  # 1500 / 1000
    assert r["throughput_2_workers_over_1"] == 1.5  # 3000 / 2000
    assert r["freshness_p99_2_workers_over_1"] is None  # no p99 for 2 workers: no ratio
    assert r["throughput_1_worker_over_local"] == 0.5  # 2000 / 4000
    assert r["freshness_p99_1_worker_over_local"] == 2.0
    # a configuration that failed (an error, no figures) gives no ratio, not a crash
    assert scaling_ratios({"1_broker_local": {"error": "x"}})["throughput_3_brokers_over_1"] is None


def test_every_bench_section_is_a_function_of_the_context_alone():
    """``make bench`` calls each registered section with the BenchContext only; a decorator left
    on a helper (it registers the helper under the section's name) fails here, not after a run."""
    import inspect

    from stories.bench import SECTIONS

    assert {"analytics", "cluster_scaling", "keyed"} <= set(SECTIONS)
    for name, fn in SECTIONS.items():
        params = list(inspect.signature(fn).parameters.values())
        assert [p.name for p in params] == ["ctx"], (name, fn.__name__)


def test_batch_durations_come_from_the_speed_layers_own_lines():
    from stories.bench_cluster import batch_seconds

    log = (
        "2026-11-24 13:00:01 INFO pipelines.speed.stream keyed batch 0: {'read': 10} in 0.532s\n"
        "2026-11-24 13:00:02 WARN some other line in 9.9s\n"
        "2026-11-24 13:00:03 INFO pipelines.speed.stream keyed batch 1: {'read': 0, 'applied': 0} in 12.000s\n"
    )
    assert batch_seconds(log) == [0.532, 12.0]
