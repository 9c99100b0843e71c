"""The ``redis_cluster`` bench (stories/bench_redis_cluster.py): the timeline writes a log implies,
worked out by hand, the arithmetic of a run's figures, and the whole measurement at a tiny size on
real servers (one redis-server and a 3-master Redis Cluster, started and stopped by the section)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.settings import get_settings
from stories.bench_redis_cluster import compare, measure, summarize, timeline_writes
from tests.unit.events import ev


def _rec(event: dict, injected: str | None = None):
    return str(event["user_id"]).encode(), event, injected


def test_the_writes_are_the_fan_out_the_log_implies():
    log = [
        _rec(ev("followed", 2, 1, followee_id=1)),
        _rec(ev("followed", 3, 2, followee_id=1)),
        _rec(ev("post_created", 1, 3, post_id=10, text="a")),  # 1's timeline, 2's and 3's: 3
        _rec(ev("unfollowed", 3, 4, followee_id=1)),
        _rec(ev("post_created", 1, 5, post_id=11, text="b")),  # 1 and 2: 2
        _rec(ev("post_created", 1, 5, post_id=11, text="b"), "duplicate"),  # not applied: 0
        _rec(ev("post_created", 1, 6, post_id=12, text="x" * 10_000), "text_too_long"),  # 0
        _rec(ev("post_created", 2, 7, post_id=13, text="c")),  # nobody follows 2: 1
        _rec(ev("user_erased", 2, 8)),  # 2's follow of 1 goes with it
        _rec(ev("post_created", 1, 9, post_id=14, text="d")),  # 1 alone: 1
        (b"1", b"{not json", "bad_json"),  # raw bytes the contract rejects: 0
    ]
    assert timeline_writes(log) == {"posts": 4, "timeline_writes": 3 + 2 + 1 + 1}


def _node(cpu_s: float, busy: float) -> dict:
    return {"cpu_s": cpu_s, "busy_cores": busy}


def test_a_runs_figures_are_its_measurements_divided():
    implied = {"events": 1_000, "posts": 100, "timeline_writes": 8_000}
    row = summarize(
        masters=3,
        wall_s=2.0,
        implied=implied,
        nodes=[_node(0.4, 0.2), _node(0.3, 0.15), _node(0.1, 0.05)],
        processors_cpu_s=0.5,
        machine_busy_s=3.6,
    )
    assert row["timeline_writes_per_s"] == 4_000  # 8,000 writes in 2 s
    assert row["events_per_s"] == 500
    assert row["redis_cpu_s"] == 0.8  # every node's CPU
    assert row["redis_us_per_timeline_write"] == 100.0  # 0.8 s / 8,000 writes
    assert row["redis_us_per_event"] == 800.0
    assert row["redis_busy_cores"] == 0.4
    assert row["busiest_node_share"] == 0.5 and row["busiest_node_busy_cores"] == 0.2
    assert row["processors_us_per_timeline_write"] == 62.5  # 0.5 s / 8,000
    assert row["machine_busy_cores"] == 1.8


def test_each_pair_is_a_ratio_and_each_layout_its_median():
    def run(pair, masters, rate, cost):
        return {
            "pair": pair,
            "masters": masters,
            "timeline_writes_per_s": rate,
            "redis_us_per_timeline_write": cost,
            "processors_us_per_timeline_write": 1.0,
            "redis_busy_cores": 1.0,
            "processors_busy_cores": 1.0,
            "machine_busy_cores": 2.0,
        }

    runs = [run(1, 1, 100, 10.0), run(1, 3, 150, 11.0), run(2, 1, 200, 8.0), run(2, 3, 200, 12.0)]
    out = compare(runs)
    assert out["pairs_writes_per_s_ratio"] == [1.5, 1.0]
    assert out["pairs_redis_us_per_write_ratio"] == [1.1, 1.5]
    assert (out["writes_per_s_three_over_one"], out["redis_us_per_write_three_over_one"]) == (1.25, 1.3)
    assert out["one_master"]["timeline_writes_per_s"] == 150  # the median of 100 and 200
    assert out["three_masters"]["redis_us_per_timeline_write"] == 11.5


@pytest.mark.timeout(180)
def test_the_measurement_at_a_tiny_size(tmp_path: Path):
    from app_sim.generator import GeneratorConfig, generate

    out = measure(get_settings(var_dir=tmp_path), tmp_path / "servers", 2_000, users=40, pairs=1)
    implied = timeline_writes(generate(2_000, GeneratorConfig(users=40)))
    assert (out["posts"], out["timeline_writes"]) == (implied["posts"], implied["timeline_writes"])
    assert out["partitions_per_master"] == [6, 6, 4]  # 16 partitions over 3 masters' slots
    assert [(r["masters"], len(r["nodes"])) for r in out["runs"]] == [(1, 1), (3, 3)]
    for r in out["runs"]:
        assert r["applied_everything"]  # every fence and every delivery at the log's end
        cpu = sum(n["cpu_s"] for n in r["nodes"])
        assert r["redis_us_per_timeline_write"] == round(cpu * 1e6 / out["timeline_writes"], 3)
        assert r["timeline_writes_per_s"] == pytest.approx(out["timeline_writes"] / r["wall_s"], rel=0.01)
        assert all(n["fcall_calls"] > 0 for n in r["nodes"])  # every master did some of the work
    one, three = out["runs"]
    assert out["pairs_writes_per_s_ratio"] == [
        round(three["timeline_writes_per_s"] / one["timeline_writes_per_s"], 3)
    ]
    assert set(out["yardstick"]) == {"zadd_single_per_s", "zadd_one_node_per_s", "zadd_cluster_per_s"}
    mem = out["memory"]
    # the configured length as Redis keeps it by default (skiplist) and as a listpack, which is smaller
    assert mem["bytes_per_entry_800_listpack"] < mem["bytes_per_entry_800_skiplist"]
    assert mem["bytes_per_tl_entry"] > 0 and mem["bytes_per_body"] > 0
