"""The read-heavy bench's verdicts (stories/bench_read_heavy.py) and the Locust profiles, on rows
worked by hand; the API's state dependency runs on the event loop."""

import asyncio
import inspect
import json
import os
import subprocess
import sys

import pytest

from stories.bench_read_heavy import judge, max_write_rate, reads_per_post


def row(rate, p99, reads, posts, produced=None, lag=0.0):
    r = {
        "write_rate_offered": rate,
        "writes_produced_per_s": rate if produced is None else produced,
        "posts_per_s": posts,
        "reads_per_s": reads,
        "p99_ms": p99,
        "reads_per_post": reads_per_post(reads, posts),
        "applied_lag_s": lag,
    }
    return {**r, **judge(r)}


def test_reads_per_post():
    assert reads_per_post(2000, 52) == 38.5
    assert reads_per_post(2000, 0) is None  # nothing posted: any read rate qualifies


def test_no_writes_is_judged_on_latency_alone():
    assert row(0, 30.0, 2500, 0)["met"]
    assert not row(0, 51.0, 2500, 0)["met"]
    assert not row(0, None, 0, 0)["p99_within_50ms"]  # no read answered


def test_each_verdict_on_its_own():
    ok = row(100, 40.0, 2000, 52)  # 38.5 reads per post
    assert ok["met"] and ok["reads_per_post_at_least_20"] and ok["writes_carried"]
    few_reads = row(300, 40.0, 2000, 156)  # 12.8 reads per post
    assert not few_reads["reads_per_post_at_least_20"] and not few_reads["met"]
    slow = row(100, 50.1, 2000, 52)
    assert not slow["p99_within_50ms"] and slow["reads_per_post_at_least_20"]
    not_produced = row(1000, 40.0, 20000, 520, produced=900)  # 90% of the offered rate
    assert not not_produced["writes_carried"]
    behind = row(1000, 40.0, 20000, 520, lag=10.5)  # applied 10.5 s after the last write
    assert not behind["writes_carried"]
    never = row(1000, 40.0, 20000, 520, lag=None)  # not within the timeout at all
    assert not never["writes_carried"]
    assert row(100, 50.0, 1040, 52)["met"]  # both bounds inclusive: p99 50 ms, 20 reads per post


def test_max_write_rate_is_the_highest_row_met():
    rows = [
        row(0, 20.0, 2500, 0),
        row(100, 30.0, 2400, 52),
        row(300, 45.0, 2300, 156),  # latency holds, reads per post do not
        row(1000, 80.0, 1500, 520),
    ]
    assert [r["met"] for r in rows] == [True, True, False, False]
    assert max_write_rate(rows) == 100
    # a noisy low row does not hide a higher one that met it
    assert max_write_rate([row(0, 60.0, 2500, 0), row(100, 30.0, 2400, 52)]) == 100
    assert max_write_rate([row(0, 60.0, 2500, 0)]) is None


# Locust monkey-patches the process (gevent) when imported: the locustfile is loaded in a child
_WEIGHTS = """
import collections, json
from app_sim import locustfile as m
print(json.dumps([m.PROFILE, collections.Counter(t.__name__ for t in m.SocialUser.tasks)]))
"""


def _locust_weights(profile: str | None) -> tuple[str, dict[str, int]]:
    """The profile the locustfile picks and its task weights (Locust repeats a task per weight)."""
    env = {k: v for k, v in os.environ.items() if k != "LOAD_PROFILE"}
    if profile is not None:
        env["LOAD_PROFILE"] = profile
    done = subprocess.run(
        [sys.executable, "-c", _WEIGHTS], env=env, capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise ValueError(done.stderr.strip().splitlines()[-1])
    name, weights = json.loads(done.stdout)
    return name, weights


def test_the_default_mix_is_unchanged():
    assert _locust_weights(None) == (
        "write_heavy",
        {
            "home_timeline": 60,
            "inbox_read": 12,
            "unread": 10,
            "someones_status": 8,
            "post": 6,
            "message": 2,
            "read_message": 1,
            "follow_more": 1,
        },
    )


def test_the_read_heavy_mix_reads_timelines_50_times_per_post():
    name, w = _locust_weights("read_heavy")
    assert name == "read_heavy"
    assert w["home_timeline"] == 50 * w["post"]
    reads = w["home_timeline"] + w["inbox_read"] + w["unread"] + w["someones_status"]
    assert reads / sum(w.values()) > 0.95


def test_an_unknown_profile_is_refused():
    with pytest.raises(ValueError, match="LOAD_PROFILE"):
        _locust_weights("read_mostly")


def test_the_api_state_dependency_is_awaited_on_the_event_loop():
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from app_sim.api.state import ApiState, get_api

    assert inspect.iscoroutinefunction(get_api)  # a plain def ran in the thread pool per request
    app = FastAPI()
    app.state.api = sentinel = object()
    seen = []

    @app.get("/probe")
    async def probe(api: ApiState):
        seen.append((api, asyncio.get_running_loop()))
        return {}

    with TestClient(app) as client:
        assert client.get("/probe").status_code == 200
    assert seen[0][0] is sentinel
