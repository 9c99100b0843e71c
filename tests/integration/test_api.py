"""The app API against the real stack: every endpoint, auth, bad input, broker down, fuzzing, e2e.

Each API here runs in-process (uvicorn in a thread) with the session stack's settings, its own
topic (``SOCIAL_EVENTS_TOPIC``) and its own views namespace, so tests never see each other's
events or views. "Nothing appended" is checked on the topic's end offsets, before and after.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import httpx
import orjson
import pytest
import requests
import uvicorn

import contract
from app_sim.auth import TokenSigner, load_secret
from contract import keys
from infra.settings import REPO_ROOT, Settings

pytestmark = pytest.mark.integration


# --- helpers ------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass
class RunningApi:
    settings: Settings
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.settings.api_port}"

    @property
    def topic(self) -> str:
        return self.settings.events_topic

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=15)

    def register(self, handle: str) -> tuple[int, str]:
        with self.client() as c:
            r = c.post("/v1/users", json={"handle": handle, "display_name": handle.title()})
        assert r.status_code == 201, r.text
        return r.json()["user_id"], r.json()["token"]

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


def start_api(settings: Settings, timeout_s: float = 30) -> RunningApi:
    from app_sim.api import create_app

    config = uvicorn.Config(
        create_app(settings), host="127.0.0.1", port=settings.api_port, log_level="warning", lifespan="on"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"api-{settings.api_port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError("the API did not start")
        time.sleep(0.05)
    return RunningApi(settings, server, thread)


def api_settings(base: Settings, topic: str, **overrides) -> Settings:
    values = {
        "events_topic": topic,
        "api_port": _free_port(),
        "views_namespace": f"apitest-{uuid.uuid4().hex[:8]}",
        "api_produce_timeout_ms": 5000,
    }
    return dataclasses.replace(base, **(values | overrides))


def end_offsets(settings: Settings, topic: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {"bootstrap.servers": settings.kafka_bootstrap, "group.id": "api-tests", "enable.auto.commit": False}
    )
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
    finally:
        c.close()


def read_topic(settings: Settings, topic: str) -> list[tuple[int, int, bytes, bytes]]:
    """Every record of the topic: (partition, offset, key, value)."""
    from confluent_kafka import Consumer, TopicPartition

    ends = end_offsets(settings, topic)
    want = sum(ends.values())
    c = Consumer(
        {"bootstrap.servers": settings.kafka_bootstrap, "group.id": "api-tests", "enable.auto.commit": False}
    )
    out = []
    try:
        c.assign([TopicPartition(topic, p, 0) for p in ends])
        deadline = time.monotonic() + 30
        while len(out) < want and time.monotonic() < deadline:
            for msg in c.consume(1000, timeout=0.5):
                if msg.error() is None:
                    out.append((msg.partition(), msg.offset(), msg.key(), msg.value()))
    finally:
        c.close()
    assert len(out) == want
    return out


def record_at(settings: Settings, topic: str, partition: int, offset: int) -> tuple[bytes, dict]:
    for p, o, key, value in read_topic(settings, topic):
        if (p, o) == (partition, offset):
            return key, orjson.loads(value)
    raise AssertionError(f"no record at {partition}:{offset}")


@pytest.fixture
def api_factory(kafka_stack, topic_factory) -> Iterator[Callable[..., RunningApi]]:
    """``api_factory(**settings_overrides)``: an API on a fresh topic, stopped after the test."""
    started: list[RunningApi] = []

    def make(**overrides) -> RunningApi:
        topic = overrides.pop("events_topic", None) or topic_factory()
        api = start_api(api_settings(kafka_stack.settings, topic, **overrides))
        started.append(api)
        return api

    yield make
    for api in started:
        api.stop()


@pytest.fixture(scope="module")
def shared_api(kafka_stack) -> Iterator[RunningApi]:
    """One API + topic for the many small bad-input cases (each checks the offsets itself)."""
    from infra.stack import create_topic, delete_topic

    topic = f"test.api-shared.{uuid.uuid4().hex[:8]}"
    create_topic(kafka_stack.settings, topic, 4)
    api = start_api(api_settings(kafka_stack.settings, topic))
    try:
        yield api
    finally:
        api.stop()
        delete_topic(kafka_stack.settings, topic)


@dataclasses.dataclass
class Cast:
    alice: int
    alice_token: str
    bob: int
    bob_token: str
    bobs_post: int
    message_to_bob: int


@pytest.fixture(scope="module")
def cast(shared_api) -> Cast:
    alice, alice_token = shared_api.register("alice")
    bob, bob_token = shared_api.register("bob")
    with shared_api.client(bob_token) as c:
        post = c.post("/v1/posts", json={"text": "bob's"}).json()["post_id"]
    with shared_api.client(alice_token) as c:
        msg = c.post("/v1/messages", json={"recipient_id": bob, "text": "hi bob"}).json()["message_id"]
    return Cast(alice, alice_token, bob, bob_token, post, msg)


# --- every endpoint -----------------------------------------------------------------------------------


def test_every_write_lands_in_the_log_as_a_valid_event_at_the_answered_position(api_factory):
    api = api_factory()
    alice, alice_token = api.register("alice")
    bob, bob_token = api.register("bob")
    a, b = api.client(alice_token), api.client(bob_token)
    before = int(time.time() * 1000)
    answers = [
        ("followed", a.post("/v1/follows", json={"followee_id": bob})),
        ("post_created", b.post("/v1/posts", json={"text": "hello"})),
        ("message_sent", a.post("/v1/messages", json={"recipient_id": bob, "text": "psst"})),
        ("status_updated", a.put("/v1/status", json={"text": "reading"})),
        ("unfollowed", a.delete(f"/v1/follows/{bob}")),
    ]
    post_id = answers[1][1].json()["post_id"]
    message_id = answers[2][1].json()["message_id"]
    answers += [
        ("post_deleted", b.delete(f"/v1/posts/{post_id}")),
        ("message_read", b.post(f"/v1/messages/{message_id}/read")),
    ]
    records = {(p, o): (k, orjson.loads(v)) for p, o, k, v in read_topic(api.settings, api.topic)}
    assert len(records) == 2 + len(answers)  # two registrations, then one event per write
    for etype, r in answers:
        assert r.status_code == 202, (etype, r.text)
        body = r.json()
        key, event = records[(body["partition"], body["offset"])]
        assert contract.validate(event) is None
        assert key == contract.record_key(event)
        assert event["type"] == etype == body["type"]
        assert event["event_id"] == body["event_id"]
        assert event["received_time"] >= before
        assert event["device_time"] == event["sent_time"] == event["received_time"]  # no client headers
    by_type = {e["type"]: e for _k, e in records.values()}
    assert by_type["followed"]["user_id"] == alice and by_type["followed"]["followee_id"] == bob
    assert by_type["post_created"]["post_id"] == post_id and by_type["post_deleted"]["post_id"] == post_id
    assert by_type["message_sent"]["recipient_id"] == bob
    assert by_type["message_read"]["user_id"] == bob  # the recipient reads, keyed by the inbox
    assert (
        records[(answers[2][1].json()["partition"], answers[2][1].json()["offset"])][0] == str(bob).encode()
    )
    from contract import writers
    from contract.ids import snowflake_worker

    # the ids carry the API process's worker id, claimed by it in the log's registry (contract.writers)
    owners = {c["worker_id"]: c["kind"] for c in writers.read_claims(api.settings) if c["won"]}
    assert snowflake_worker(post_id) == snowflake_worker(alice) and owners[snowflake_worker(alice)] == "api"
    a.close()
    b.close()


def test_client_clock_headers_and_idempotency_key(api_factory):
    api = api_factory()
    _alice, token = api.register("alice")
    now = int(time.time() * 1000)
    device, sent = now - 3_600_000, now - 55_000  # written an hour ago, sent by a clock ~a minute slow
    with api.client(token) as c:
        h = {"X-Device-Time": str(device), "X-Sent-Time": str(sent), "Idempotency-Key": "retry-1"}
        first = c.post("/v1/posts", json={"text": "once"}, headers=h)
        before = end_offsets(api.settings, api.topic)
        again = c.post("/v1/posts", json={"text": "once"}, headers=h)
        other = c.post("/v1/posts", json={"text": "different"}, headers=h)
    assert first.status_code == again.status_code == 202
    assert again.json() == first.json()  # the first answer again ...
    assert end_offsets(api.settings, api.topic) == before  # ... and nothing appended twice
    assert other.status_code == 422 and other.json()["error"] == "idempotency_key_reused"
    _k1, e1 = record_at(api.settings, api.topic, first.json()["partition"], first.json()["offset"])
    assert e1["event_id"] == first.json()["event_id"]
    assert (e1["device_time"], e1["sent_time"]) == (device, sent)
    assert e1["received_time"] > e1["sent_time"]


def _seed_views(api: RunningApi, alice: int, bob: int) -> None:
    """Write the serving store's keys directly (what the speed layer would), to test the read path."""
    import redis

    r = redis.Redis.from_url(api.settings.redis_url, decode_responses=True)
    ns = api.settings.views_namespace
    post = {"post_id": 42, "author_id": bob, "text": "from bob", "event_time": 1000}
    r.set(f"{ns}:p:{bob}:42", orjson.dumps(post))
    r.zadd(f"{ns}:tl:{alice}", {str(42).zfill(19) + str(bob).zfill(19): 1000})  # post, then author
    msg = {"message_id": 7, "sender_id": bob, "text": "hey", "event_time": 900, "read": False}
    r.zadd(f"{ns}:inbox:{alice}", {str(7).zfill(19): 900})
    r.hset(f"{ns}:msgs:{alice}", 7, orjson.dumps(msg))
    r.hset(f"{ns}:unread", alice, 1)
    r.hset(f"{ns}:status", bob, orjson.dumps({"text": "away", "event_time": 800}))
    r.hset(f"{ns}:fence", mapping={"0": 5, "1": 9})


def test_reads_come_from_the_serving_store_with_as_of(api_factory):
    # the keyed layout's keys, written by hand (the partitioned layout's reads through the API:
    # tests/unit/test_api_partitioned.py)
    api = api_factory(serving_layout="keyed")
    alice, token = api.register("alice")
    bob, _ = api.register("bob")
    _seed_views(api, alice, bob)
    with api.client(token) as c:
        tl = c.get("/v1/timeline", params={"limit": 10}).json()
        inbox = c.get("/v1/inbox").json()
        unread = c.get("/v1/unread").json()
    with api.client() as anonymous:
        status = anonymous.get(f"/v1/users/{bob}/status")
        no_status = anonymous.get(f"/v1/users/{alice}/status")
        nobody = anonymous.get("/v1/users/12345/status")
        health = anonymous.get("/v1/health")
        openapi = anonymous.get("/openapi.json")
    as_of = {"0": 5, "1": 9}
    assert tl == {
        "user_id": alice,
        "posts": [{"post_id": 42, "author_id": bob, "text": "from bob", "event_time": 1000}],
        "as_of": as_of,
    }
    assert inbox["messages"][0]["message_id"] == 7 and inbox["as_of"] == as_of
    assert unread == {"user_id": alice, "unread": 1, "as_of": as_of}
    assert status.status_code == 200 and status.json()["status"]["text"] == "away"
    assert no_status.status_code == 200 and no_status.json()["status"] is None  # registered, never set
    assert nobody.status_code == 404 and nobody.json()["error"] == "unknown_user"
    assert health.status_code == 200 and health.json()["namespace"] == api.settings.views_namespace
    assert openapi.status_code == 200 and "/v1/timeline" in openapi.json()["paths"]


def test_a_blue_green_switch_is_picked_up_without_restart(api_factory):
    import redis

    from contract import namespaces

    api = api_factory(views_namespace="", serving_layout="keyed")  # follow Redis active_namespace
    alice, token = api.register("alice")
    r = redis.Redis.from_url(api.settings.redis_url, decode_responses=True)
    previous = r.get(namespaces.REDIS_KEY)
    blue, green = f"blue-{uuid.uuid4().hex[:6]}", f"green-{uuid.uuid4().hex[:6]}"
    r.hset(f"{blue}:unread", alice, 1)
    r.hset(f"{green}:unread", alice, 2)
    try:
        r.set(namespaces.REDIS_KEY, blue)
        time.sleep(1.1)
        with api.client(token) as c:
            assert c.get("/v1/unread").json()["unread"] == 1
            r.set(namespaces.REDIS_KEY, green)
            time.sleep(1.1)
            assert c.get("/v1/unread").json()["unread"] == 2
    finally:
        if previous is None:
            r.delete(namespaces.REDIS_KEY)
        else:
            r.set(namespaces.REDIS_KEY, previous)


def test_me_endpoints_only_ever_show_the_callers_own(shared_api, cast):
    # alice's token with any attempt to name bob: the answer is still about alice
    with shared_api.client(cast.alice_token) as c:
        for path in ("/v1/inbox", "/v1/unread", "/v1/timeline"):
            r = c.get(path, params={"user_id": cast.bob, "recipient_id": cast.bob})
            assert r.status_code == 200 and r.json()["user_id"] == cast.alice
    spec = httpx.get(f"{shared_api.url}/openapi.json").json()
    for path in ("/v1/inbox", "/v1/unread", "/v1/timeline"):
        params = [p["name"] for p in spec["paths"][path]["get"].get("parameters", [])]
        assert params in ([], ["limit"]), params  # no request shape names another user


# --- auth -----------------------------------------------------------------------------------------------

FORGED = TokenSigner(b"not the server's secret")


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Basic YWxpY2U6c2VjcmV0",
        "Bearer not-a-token",
        "Bearer 123",
        "Bearer " + FORGED.issue(1),
        "Bearer ünïcode",
    ],
    ids=[
        "missing",
        "empty",
        "no-token",
        "basic",
        "garbage",
        "unsigned",
        "forged",
        "non-ascii",
    ],
)
def test_missing_malformed_or_forged_token_is_401_and_appends_nothing(shared_api, cast, authorization):
    before = end_offsets(shared_api.settings, shared_api.topic)
    headers = {} if authorization is None else {"Authorization": authorization.encode("utf-8")}
    with httpx.Client(base_url=shared_api.url, timeout=10) as c:
        for method, path, body in [
            ("POST", "/v1/posts", {"text": "x"}),
            ("POST", "/v1/follows", {"followee_id": cast.bob}),
            ("PUT", "/v1/status", {"text": "x"}),
            ("GET", "/v1/inbox", None),
            ("GET", "/v1/unread", None),
            ("GET", "/v1/timeline", None),
        ]:
            r = c.request(method, path, json=body, headers=headers)
            assert r.status_code == 401, (path, r.text)
            assert r.json()["error"] == "unauthorized"
            assert r.headers["www-authenticate"] == "Bearer"
    assert end_offsets(shared_api.settings, shared_api.topic) == before


def test_a_tampered_token_does_not_become_another_user(shared_api, cast):
    user, _, sig = cast.alice_token.partition(".")
    with shared_api.client(f"{cast.bob}.{sig}") as c:
        assert c.get("/v1/inbox").status_code == 401


# --- bad input --------------------------------------------------------------------------------------------

LONG = "x" * (contract.MAX_TEXT_LENGTH + 1)

# (who, method, path, json body or raw bytes, extra headers, status, error code); {bob}, {post},
# {msg} are filled from the cast
BAD = {
    "unknown-field": ("alice", "POST", "/v1/posts", {"text": "hi", "user_id": 1}, {}, 422, "invalid_request"),
    "unknown-field-register": (
        "anyone",
        "POST",
        "/v1/users",
        {"handle": "x", "display_name": "x", "user_id": 1},
        {},
        422,
        "invalid_request",
    ),
    "wrong-type-text": ("alice", "POST", "/v1/posts", {"text": 5}, {}, 422, "invalid_request"),
    "wrong-type-id-string": (
        "alice",
        "POST",
        "/v1/follows",
        {"followee_id": "{bob_str}"},
        {},
        422,
        "invalid_request",
    ),
    "wrong-type-id-float": ("alice", "POST", "/v1/follows", {"followee_id": 1.0}, {}, 422, "invalid_request"),
    "wrong-type-bool": (
        "alice",
        "POST",
        "/v1/messages",
        {"recipient_id": True, "text": "x"},
        {},
        422,
        "invalid_request",
    ),
    "id-beyond-int64": ("alice", "POST", "/v1/follows", {"followee_id": 2**63}, {}, 422, "invalid_request"),
    "missing-field": ("alice", "POST", "/v1/messages", {"text": "x"}, {}, 422, "invalid_request"),
    "not-json": (
        "alice",
        "POST",
        "/v1/posts",
        b"{text: hi",
        {"Content-Type": "application/json"},
        422,
        "invalid_request",
    ),
    "not-an-object": ("alice", "POST", "/v1/posts", ["hi"], {}, 422, "invalid_request"),
    "empty-text": ("alice", "POST", "/v1/posts", {"text": ""}, {}, 422, "invalid_request"),
    "oversized-text": ("alice", "POST", "/v1/posts", {"text": LONG}, {}, 422, "invalid_request"),
    "oversized-status": ("alice", "PUT", "/v1/status", {"text": LONG}, {}, 422, "invalid_request"),
    "oversized-message": (
        "alice",
        "POST",
        "/v1/messages",
        {"recipient_id": "{bob}", "text": LONG},
        {},
        422,
        "invalid_request",
    ),
    "not-utf8-body": (
        "alice",
        "POST",
        "/v1/posts",
        b'{"text": "caf\xe9"}',
        {"Content-Type": "application/json"},
        400,
        "undecodable_body",
    ),
    "device-time-year-9999": (
        "alice",
        "POST",
        "/v1/posts",
        {"text": "x"},
        {"X-Device-Time": "253402300799999"},
        400,
        "bad_header",
    ),
    "device-time-int64-max": (
        "alice",
        "POST",
        "/v1/posts",
        {"text": "x"},
        {"X-Device-Time": "9223372036854775807", "X-Sent-Time": "0"},
        400,
        "bad_header",
    ),
    "sent-time-int64-max": (
        "alice",
        "PUT",
        "/v1/status",
        {"text": "x"},
        {"X-Sent-Time": "9223372036854775807"},
        400,
        "bad_header",
    ),
    "lone-surrogate": (
        "alice",
        "POST",
        "/v1/posts",
        b'{"text": "\\ud800"}',
        {"Content-Type": "application/json"},
        422,
        "invalid_request",
    ),
    "bad-handle": (
        "anyone",
        "POST",
        "/v1/users",
        {"handle": "no spaces!", "display_name": "x"},
        {},
        422,
        "invalid_request",
    ),
    "long-handle": (
        "anyone",
        "POST",
        "/v1/users",
        {"handle": "h" * 16, "display_name": "x"},
        {},
        422,
        "invalid_request",
    ),
    "self-follow": ("alice", "POST", "/v1/follows", {"followee_id": "{alice}"}, {}, 422, "self_follow"),
    "self-unfollow": ("alice", "DELETE", "/v1/follows/{alice}", None, {}, 422, "self_follow"),
    "unknown-followee": ("alice", "POST", "/v1/follows", {"followee_id": 987654321}, {}, 404, "unknown_user"),
    "unknown-unfollowee": ("alice", "DELETE", "/v1/follows/987654321", None, {}, 404, "unknown_user"),
    "unknown-recipient": (
        "alice",
        "POST",
        "/v1/messages",
        {"recipient_id": 987654321, "text": "x"},
        {},
        404,
        "unknown_user",
    ),
    # a post is (author, post): bob's post id names no post of alice's
    "delete-someone-elses-post": ("alice", "DELETE", "/v1/posts/{post}", None, {}, 404, "unknown_post"),
    "erase-someone-else": ("alice", "DELETE", "/v1/users/{bob}", None, {}, 403, "not_yourself"),
    "erase-unknown-user": ("alice", "DELETE", "/v1/users/987654321", None, {}, 404, "unknown_user"),
    "erase-without-token": ("anyone", "DELETE", "/v1/users/me", None, {}, 401, "unauthorized"),
    "delete-missing-post": ("alice", "DELETE", "/v1/posts/987654321", None, {}, 404, "unknown_post"),
    "read-someone-elses-message": (
        "alice",
        "POST",
        "/v1/messages/{msg}/read",
        None,
        {},
        404,
        "unknown_message",
    ),
    "read-missing-message": ("bob", "POST", "/v1/messages/987654321/read", None, {}, 404, "unknown_message"),
    "bad-path-id": ("alice", "DELETE", "/v1/posts/abc", None, {}, 422, "invalid_request"),
    "zero-path-id": ("alice", "DELETE", "/v1/posts/0", None, {}, 422, "invalid_request"),
    "bad-idempotency-key": (
        "alice",
        "POST",
        "/v1/posts",
        {"text": "x"},
        {"Idempotency-Key": "x" * 65},
        400,
        "bad_header",
    ),
    "bad-device-time": (
        "alice",
        "POST",
        "/v1/posts",
        {"text": "x"},
        {"X-Device-Time": "-5"},
        400,
        "bad_header",
    ),
    "bad-sent-time": (
        "alice",
        "POST",
        "/v1/posts",
        {"text": "x"},
        {"X-Sent-Time": "soon"},
        400,
        "bad_header",
    ),
    "limit-zero": ("alice", "GET", "/v1/timeline?limit=0", None, {}, 422, "invalid_request"),
    "limit-huge": ("alice", "GET", "/v1/inbox?limit=100000", None, {}, 422, "invalid_request"),
}


def _fill(value, cast: Cast):
    names = {
        "bob": cast.bob,
        "bob_str": str(cast.bob),
        "alice": cast.alice,
        "post": cast.bobs_post,
        "msg": cast.message_to_bob,
    }
    if isinstance(value, str):
        if value.startswith("{") and value.endswith("}") and value[1:-1] in names:
            return names[value[1:-1]]
        return value.format(**names)
    if isinstance(value, dict):
        return {k: _fill(v, cast) for k, v in value.items()}
    return value


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_input_is_a_4xx_json_error_and_appends_nothing(shared_api, cast, case):
    who, method, path, body, headers, status, code = BAD[case]
    token = {"alice": cast.alice_token, "bob": cast.bob_token}.get(who)
    before = end_offsets(shared_api.settings, shared_api.topic)
    with shared_api.client(token) as c:
        kwargs = {"content": body} if isinstance(body, bytes) else {"json": _fill(body, cast)}
        r = c.request(method, _fill(path, cast), headers=headers, **({} if body is None else kwargs))
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    error = r.json()
    assert error["error"] == code and error["detail"]
    assert end_offsets(shared_api.settings, shared_api.topic) == before


def test_what_the_api_wrote_itself_counts_before_the_store_has_it(shared_api, cast):
    # no speed layer runs here, so only the API's own memory knows bob, his post and the message
    with shared_api.client(cast.bob_token) as c:
        assert c.post(f"/v1/messages/{cast.message_to_bob}/read").status_code == 202
        deleted = c.delete(f"/v1/posts/{cast.bobs_post}")
        assert deleted.status_code == 202
        again = c.delete(f"/v1/posts/{cast.bobs_post}")
        assert again.status_code == 404  # deleted is deleted, even before the views know


def test_erasure_appends_user_erased_and_revokes_the_token(api_factory):
    """DELETE /v1/users/me and /v1/users/{own id}: 202 with the event's position, the event in
    the log, then 401 for that token; the handle can be registered again (a new user id)."""
    import redis

    api = api_factory(serving_layout="keyed")  # (its erased set written by hand below)
    alice, alice_token = api.register("alice")
    bob, bob_token = api.register("bob")
    store = keys.KeyStore.for_settings(api.settings)
    with api.client(alice_token) as c:
        posted = c.post("/v1/posts", json={"text": "canary 41f3 of alice"}).json()
        _key, post = record_at(api.settings, api.topic, posted["partition"], posted["offset"])
        # crypto-shredding: the log holds the text sealed with alice's key, never the plaintext
        assert contract.is_sealed(post["text"]) and "41f3" not in post["text"]
        assert keys.key_id(post["text"]) == alice
        assert keys.open_fields(store, [dict(post)], "text")[0]["text"] == "canary 41f3 of alice"
        r = c.delete("/v1/users/me")
        assert r.status_code == 202, r.text
        out = r.json()
        assert c.get("/v1/inbox").status_code == 401
        again = c.delete("/v1/users/me")
        assert again.status_code == 401 and "erased" in again.json()["detail"]
    key, event = record_at(api.settings, api.topic, out["partition"], out["offset"])
    assert key == str(alice).encode() and event["type"] == "user_erased" and event["user_id"] == alice
    assert event["event_id"] == out["event_id"] and contract.validate(event) is None
    # the key is gone: every copy of that sealed text is unreadable now, and no new key is made
    assert store.get(alice) is None and keys.open_fields(store, [dict(post)], "text")[0]["text"] is None
    with pytest.raises(keys.Erased):
        store.ensure([alice])
    with api.client(bob_token) as c:
        assert c.delete(f"/v1/users/{bob}").status_code == 202  # one's own id: the same as /me
        assert c.get("/v1/unread").status_code == 401
    # the same handle again: a new user, whose token works
    alice2, token2 = api.register("alice")
    assert alice2 != alice
    with api.client(token2) as c:
        assert c.get("/v1/unread").status_code == 200
    # the speed layer's tombstone alone also revokes (a crash between append and revocation)
    r = redis.Redis.from_url(api.settings.redis_url)
    r.sadd(f"{api.settings.views_namespace}:erased", alice2)
    with api.client(token2) as c:
        assert c.get("/v1/unread").status_code == 401


def test_social_erase_operator_command(api_factory):
    api = api_factory()
    carol, token = api.register("carol")
    env = {
        "SOCIAL_EVENTS_TOPIC": api.topic,
        "SOCIAL_VIEWS_NAMESPACE": api.settings.views_namespace,
        "SOCIAL_KAFKA_BOOTSTRAP": api.settings.kafka_bootstrap,
        "SOCIAL_REDIS_URL": api.settings.redis_url,
        "SOCIAL_VAR_DIR": str(api.settings.var_dir),
    }
    import os

    def erase(user_id):
        return subprocess.run(
            [sys.executable, "-m", "app_sim.erase", "--user-id", str(user_id)],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )

    before = end_offsets(api.settings, api.topic)
    unknown = erase(987654321)
    assert unknown.returncode == 2 and "unknown user 987654321" in unknown.stderr
    assert end_offsets(api.settings, api.topic) == before
    done = erase(carol)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    _key, event = record_at(api.settings, api.topic, out["partition"], out["offset"])
    assert event["type"] == "user_erased" and event["user_id"] == carol
    with api.client(token) as c:
        assert c.get("/v1/unread").status_code == 401
    assert keys.KeyStore.for_settings(api.settings).get(carol) is None  # her data key is deleted


def test_broker_down_is_a_quick_503_never_a_hang(kafka_stack, private_settings, tmp_path):
    from infra.stack import KafkaBroker, Stack, create_topic

    # a broker of this test's own, stopped under the running API (an API does not start without
    # one: it claims its snowflake worker id in the log's registry first, contract/writers.py)
    own = private_settings(tmp_path / "var", redis_port=kafka_stack.settings.redis_port)
    broker = Stack(own, service_types=(KafkaBroker,))
    broker.up()
    try:
        create_topic(own, "social.down", 2)
        settings = api_settings(own, "social.down", api_produce_timeout_ms=1500)
        api = start_api(settings)
        broker.down()
        _posts_answer_503_quickly(api, settings)
    finally:
        broker.down()


def _posts_answer_503_quickly(api: RunningApi, settings: Settings) -> None:
    try:
        signer = TokenSigner(load_secret(settings))
        with api.client(signer.issue(1)) as c:
            t = time.monotonic()
            r = c.post("/v1/posts", json={"text": "into the void"})
            took = time.monotonic() - t
            reg = c.post("/v1/users", json={"handle": "nobody", "display_name": "Nobody"})
        assert r.status_code == 503 and r.json()["error"] == "log_unavailable", r.text
        assert took < 5
        assert reg.status_code == 503  # registration too: no token for a user the log never saw
        assert "token" not in reg.json()
    finally:
        api.stop()


# --- fuzzing ----------------------------------------------------------------------------------------------


def test_fuzz_from_openapi_no_5xx_and_every_record_is_valid(api_factory):
    import schemathesis
    from hypothesis import HealthCheck, given, settings

    api = api_factory()
    alice, token = api.register("alice")
    api.register("bob")
    schema = schemathesis.openapi.from_url(f"{api.url}/openapi.json")
    failures: list[str] = []
    calls = 0
    session = requests.Session()
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(
            max_examples=30,
            derandomize=True,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def exercise(case):
            nonlocal calls
            calls += 1
            # half the calls as alice (deep into the handlers), half with whatever was generated
            headers = {"Authorization": f"Bearer {token}"} if calls % 2 else None
            response = case.call(base_url=api.url, session=session, headers=headers, timeout=15)
            if response.status_code >= 500:
                failures.append(
                    f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:200]}"
                )
            else:
                orjson.loads(response.content)  # every answer is JSON, errors included

        exercise()
    session.close()
    assert calls >= 100
    assert not failures, "\n".join(failures[:10])
    records = read_topic(api.settings, api.topic)
    assert records, "the fuzzer should have made some valid writes"
    for _p, _o, key, value in records:
        event = orjson.loads(value)
        assert contract.validate(event) is None, event
        assert key == contract.record_key(event)


# --- end to end, through the speed layer -------------------------------------------------------------------


def _wait_visible(c: httpx.Client, path: str, write: dict, timeout_s: float = 300) -> dict:
    """Poll a read until its as_of covers the write (as_of[partition] > offset)."""
    deadline = time.monotonic() + timeout_s
    while True:
        body = c.get(path).json()
        if body["as_of"].get(str(write["partition"]), 0) > write["offset"]:
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"{path}: as_of {body['as_of']} never covered {write}")
        time.sleep(0.2)


def test_end_to_end_users_see_exactly_their_own_writes(api_factory, topic_factory, speed_layer_factory):
    topic = topic_factory()
    namespace = f"e2e-{uuid.uuid4().hex[:8]}"
    api = api_factory(events_topic=topic, views_namespace=namespace)
    # the API's reads are the whole check: no archiver (its JVM would only compete for the cores)
    speed_layer_factory(topic=topic, namespace=namespace, archive=False)
    alice, at = api.register("alice")
    bob, bt = api.register("bob")
    carol, ct = api.register("carol")
    a, b, c = api.client(at), api.client(bt), api.client(ct)
    try:
        a.post("/v1/follows", json={"followee_id": bob}).raise_for_status()
        p1 = b.post("/v1/posts", json={"text": "bob one"}).json()
        p2 = b.post("/v1/posts", json={"text": "bob two"}).json()
        pc = c.post("/v1/posts", json={"text": "carol, unfollowed by alice"}).json()
        pa = a.post("/v1/posts", json={"text": "alice's own"}).json()
        for w in (p1, p2, pc, pa):
            tl = _wait_visible(a, "/v1/timeline", w)
        assert [p["post_id"] for p in tl["posts"]] == [pa["post_id"], p2["post_id"], p1["post_id"]]

        # delete one of bob's posts; unfollow bob: alice's timeline is then only her own post
        d = b.delete(f"/v1/posts/{p1['post_id']}").json()
        tl = _wait_visible(a, "/v1/timeline", d)
        assert [p["post_id"] for p in tl["posts"]] == [pa["post_id"], p2["post_id"]]
        u = a.delete(f"/v1/follows/{bob}").json()
        tl = _wait_visible(a, "/v1/timeline", u)
        assert [p["post_id"] for p in tl["posts"]] == [pa["post_id"]]
        assert [p["post_id"] for p in _wait_visible(b, "/v1/timeline", d)["posts"]] == [p2["post_id"]]

        # messages: bob's unread counts alice's two messages; reading one leaves one; carol has none
        m1 = a.post("/v1/messages", json={"recipient_id": bob, "text": "one"}).json()
        m2 = a.post("/v1/messages", json={"recipient_id": bob, "text": "two"}).json()
        _wait_visible(b, "/v1/unread", m1)
        assert _wait_visible(b, "/v1/unread", m2)["unread"] == 2
        inbox = _wait_visible(b, "/v1/inbox", m2)["messages"]
        assert {m["message_id"] for m in inbox} == {m1["message_id"], m2["message_id"]}
        r = b.post(f"/v1/messages/{m1['message_id']}/read").json()
        assert _wait_visible(b, "/v1/unread", r)["unread"] == 1
        assert _wait_visible(a, "/v1/unread", r)["unread"] == 0  # alice sent them; her inbox is empty
        assert _wait_visible(c, "/v1/inbox", r)["messages"] == []
        s = c.put("/v1/status", json={"text": "on holiday"}).json()
        deadline = time.monotonic() + 300
        while (st := a.get(f"/v1/users/{carol}/status").json())["as_of"].get(str(s["partition"]), 0) <= s[
            "offset"
        ]:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert st["status"]["text"] == "on holiday"
    finally:
        for client in (a, b, c):
            client.close()


# --- make load: Locust's exit status is the serving target's verdict ------------------------------------


def test_make_load_fails_through_locusts_exit_code_when_the_target_is_missed(api_factory, tmp_path):
    """`python -m app_sim.load` with locust.conf: Locust's exit status 1 when the target is missed."""
    api = api_factory()
    run = ["--users", "4", "--spawn-rate", "4", "--run-time", "6s"]

    def load(out: str, *target: str) -> tuple[int, dict]:
        done = subprocess.run(
            [sys.executable, "-m", "app_sim.load", "--host", api.url, "--out", str(tmp_path / out), "--"]
            + run
            + list(target),
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        summary = json.loads((tmp_path / out / "summary.json").read_text())
        return done.returncode, summary

    code, summary = load("missed", "--max-read-p99-ms", "0.001")  # no read is that fast
    assert code == 1, summary
    assert summary["locust_exit_code"] == 1  # the file says what the command's status said
    assert summary["reads"]["requests"] > 0
    assert summary["target"]["met"] is False
    assert summary["target"]["misses"][0].startswith("reads p99 ")
    code, summary = load("met", "--max-read-p99-ms", "60000", "--max-fail-ratio", "0.5")
    assert code == 0, summary
    assert summary["locust_exit_code"] == 0
    assert summary["target"] == {
        "max_read_p99_ms": 60000.0,
        "max_fail_ratio": 0.5,
        "met": True,
        "misses": [],
    }


# --- GET /metrics: the API's own requests, latency and appends -----------------------------------------


def _scrape(api: RunningApi) -> dict[tuple[str, tuple], float]:
    """Every sample of the API's /metrics (no token): {(name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    with api.client() as c:
        r = c.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def test_metrics_count_requests_by_route_template_and_appends_by_outcome(api_factory):
    api = api_factory()
    alice, token = api.register("metrics_alice")
    before = _scrape(api)
    with api.client(token) as c:
        for _ in range(3):
            assert c.get("/v1/unread").status_code == 200
        assert c.get(f"/v1/users/{alice}/status").status_code == 200
        assert c.post("/v1/posts", json={"text": "counted"}).status_code == 202
        assert c.get("/v1/no/such/route").status_code == 404
    with api.client() as c:
        assert c.get("/v1/unread").status_code == 401
        assert "/metrics" not in c.get("/openapi.json").json()["paths"]
    after = _scrape(api)

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    requests_total = "social_api_requests_total"
    assert delta(requests_total, route="/v1/unread", method="GET", status="200") == 3
    assert delta(requests_total, route="/v1/unread", method="GET", status="401") == 1
    assert delta(requests_total, route="/v1/users/{user_id}/status", method="GET", status="200") == 1
    assert delta(requests_total, route="/v1/posts", method="POST", status="202") == 1
    assert delta(requests_total, route="unmatched", method="GET", status="404") == 1
    assert after[(requests_total, (("method", "POST"), ("route", "/v1/users"), ("status", "201")))] == 1
    # the read's latency histogram: every request counted, in +Inf and in the sum
    assert delta("social_api_request_seconds_count", route="/v1/unread", method="GET") == 4
    assert delta("social_api_request_seconds_bucket", route="/v1/unread", method="GET", le="+Inf") == 4
    assert 0 < delta("social_api_request_seconds_sum", route="/v1/unread", method="GET") < 60
    assert (
        after[
            (
                "social_api_request_seconds_bucket",
                (("le", "0.05"), ("method", "GET"), ("route", "/v1/unread")),
            )
        ]
        >= 0
    )
    # appends: the registration before, the post between the scrapes, none failed
    assert (
        after[("social_api_appends_total", (("outcome", "acknowledged"), ("type", "user_registered")))] == 1
    )
    assert delta("social_api_appends_total", outcome="acknowledged", type="post_created") == 1
    assert not any(
        name == "social_api_appends_total" and ("outcome", "failed") in labels for name, labels in after
    )
    # route templates only: no raw id ever becomes a label value
    assert not any(str(alice) in value for _, labels in after for _, value in labels)


def test_one_scrape_of_metrics_counts_both_uvicorn_workers(kafka_stack, topic_factory):
    """`python -m app_sim.api` with 2 workers: each request counted once, whichever worker served
    it, in every scrape, whichever worker answers it (prometheus-client's multiprocess mode)."""
    from concurrent.futures import ThreadPoolExecutor

    from app_sim.api.metrics import multiproc_dir
    from infra.stack import settings_env

    settings = api_settings(kafka_stack.settings, topic_factory(), api_workers=2)
    url = f"http://127.0.0.1:{settings.api_port}"
    stale = multiproc_dir(settings)
    stale.mkdir(parents=True)
    (stale / "counter_1.db").write_bytes(b"an earlier run's")  # emptied by the parent at start
    proc = subprocess.Popen(
        [sys.executable, "-m", "app_sim.api"],
        env=settings_env(settings),
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )

    def health() -> int:
        with httpx.Client(base_url=url, timeout=15) as c:  # a connection of its own each time
            return c.get("/v1/health").status_code

    try:
        served = 0
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()
            try:
                served += health() == 200
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the API did not start"
                time.sleep(0.2)
        # concurrent requests on fresh connections until both workers served some (one file each)
        with ThreadPoolExecutor(8) as pool:
            for _ in range(50):
                codes = list(pool.map(lambda _: health(), range(16)))
                assert codes == [200] * 16
                served += 16
                if len(list(multiproc_dir(settings).glob("counter_*.db"))) == 2:
                    break
        assert len(list(multiproc_dir(settings).glob("counter_*.db"))) == 2, "one worker served all"
        for _ in range(6):  # fresh connections: each scrape answered by either worker
            with httpx.Client(base_url=url, timeout=15) as c:
                text = c.get("/metrics").text
            assert (
                f'social_api_requests_total{{method="GET",route="/v1/health",status="200"}} {served}.0'
                in text
            )
            assert f'social_api_request_seconds_count{{method="GET",route="/v1/health"}} {served}.0' in text
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
