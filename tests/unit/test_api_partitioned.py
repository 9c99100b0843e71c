"""The app API's reads in the partitioned layout (SOCIAL_SERVING_LAYOUT=partitioned), against a
real redis-server: each user's views are read from the partition librdkafka's partitioner gives
the user's record key (users 1-4 are in partitions 7, 5, 3 and 0 of 8). The expected answers are
worked out by hand from docs/views.md; the timeline is asked of the fast path and of the route.
"""

from __future__ import annotations

import asyncio
import json

import orjson
import pytest

from app_sim import auth
from app_sim.api import app as app_module
from contract.serving import partition_of
from infra.settings import get_settings
from pipelines.speed.partitioned import PartitionedProcessor
from pipelines.speed.processor import ProcessorConfig
from tests.unit.events import T0, ev
from tests.unit.test_api_fastpath import _call

NS = "api_partitioned"


@pytest.fixture(scope="module")
def api_settings(redis_url, tmp_path_factory):
    settings = get_settings(
        redis_url=redis_url,
        var_dir=tmp_path_factory.mktemp("api-partitioned"),
        views_namespace=NS,
        api_secret="partitioned-test",
        kafka_bootstrap="127.0.0.1:1",  # no broker: reads append nothing
        serving_layout="partitioned",
        events_partitions=8,
    )
    log = [
        ev("followed", 1, 0, followee_id=2),
        ev("user_registered", 2, 0.5, handle="bob", display_name="Bob"),
        ev("post_created", 2, 1, post_id=20, text="a"),
        ev("message_sent", 3, 2, message_id=30, recipient_id=1, text="hello"),
        ev("status_updated", 2, 3, text="here"),
        ev("post_created", 4, 4, post_id=40, text="b"),
        ev("followed", 1, 5, followee_id=4),  # a backfill, from partition 7's replica of 4's posts
        ev("user_erased", 3, 6),  # 3's message to 1 stays, anonymised, in partition 7
    ]
    proc = PartitionedProcessor(
        ProcessorConfig(redis_url=redis_url, namespace=NS, record_freshness=False, layout="partitioned"), 8
    )
    offsets: dict[int, int] = {}
    for e in log:
        p = partition_of(e.get("recipient_id", e["user_id"]), 8)
        proc.process(p, [(offsets.get(p, 0), json.dumps(e).encode())])
        offsets[p] = offsets.get(p, 0) + 1
        proc.settle()
    return settings


def _get(settings, path: str, user: int, monkeypatch, query: bytes = b"") -> tuple[int, dict]:
    monkeypatch.setattr(app_module, "claim_worker_id", lambda _settings: 1)
    app = app_module.create_app(settings)
    token = auth.TokenSigner(auth.load_secret(settings)).issue(user)

    async def run():
        async with app.router.lifespan_context(app):
            return await _call(app, "GET", query, [(b"authorization", f"Bearer {token}".encode())], path)

    status, _headers, body = asyncio.run(run())
    return status, orjson.loads(body)


def test_the_api_reads_each_user_from_the_partition_that_owns_them(api_settings, monkeypatch):
    s = api_settings
    status, body = _get(s, "/v1/timeline", 1, monkeypatch, b"limit=50")
    assert status == 200
    assert [(p["author_id"], p["post_id"], p["text"], p["event_time"]) for p in body["posts"]] == [
        (4, 40, "b", T0 + 4000),
        (2, 20, "a", T0 + 1000),
    ]
    # as_of: user 1's partition (7) covers its 3 records, and the other partitions' deliveries
    assert body["as_of"]["7"] == 3
    status, body = _get(s, "/v1/inbox", 1, monkeypatch)
    assert status == 200
    assert body["messages"] == [
        {"message_id": 30, "sender_id": 0, "text": None, "event_time": T0 + 2000, "read": False}
    ]
    assert _get(s, "/v1/unread", 1, monkeypatch)[1]["unread"] == 1
    status, body = _get(s, "/v1/users/2/status", 1, monkeypatch)
    assert (status, body["status"]) == (200, {"text": "here", "event_time": T0 + 3000})
    # the erased user's token is refused: their erasure is read from their own partition (3)
    assert _get(s, "/v1/timeline", 3, monkeypatch, b"limit=50")[0] == 401
    assert _get(s, "/v1/unread", 3, monkeypatch)[0] == 401


def test_the_timelines_fast_path_and_route_agree_in_the_partitioned_layout(api_settings, monkeypatch):
    from app_sim.api import fastpath

    fast = _get(api_settings, "/v1/timeline", 1, monkeypatch, b"limit=50")
    monkeypatch.setattr(fastpath.TimelineFastPath, "_answer", lambda *a: _false())
    slow = _get(api_settings, "/v1/timeline", 1, monkeypatch, b"limit=50")
    assert fast == slow and len(fast[1]["posts"]) == 2


async def _false() -> bool:
    return False


def test_a_read_on_a_redis_without_the_library_loads_it(api_settings, monkeypatch):
    """A store no speed layer of this version has started on (a Redis restarted without its
    functions, a fresh replica): every read loads the partitioned library once and answers, as the
    keyed reads do, instead of a 503."""
    import redis

    s = api_settings
    r = redis.Redis.from_url(s.redis_url)
    r.function_delete("partitioned")
    status, body = _get(s, "/v1/users/2/status", 1, monkeypatch)
    assert (status, body["status"]) == (200, {"text": "here", "event_time": T0 + 3000})
    assert r.fcall_ro("p_version", 0)  # loaded again
