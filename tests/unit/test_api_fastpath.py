"""GET /v1/timeline's fast path (app_sim/api/fastpath.py) answers exactly as the route does.

The same requests go to the app with the fast path and with it switched off (every request handed
to the FastAPI route); status, headers, body and the metrics must be equal. The store is a real
redis-server (``redis_url``) holding a namespace written as the bench writes it, with sealed texts,
an erased author and a revoked user; no Kafka (the worker id claim is stubbed, reads append nothing).
"""

from __future__ import annotations

import asyncio
import dataclasses

import orjson
import pytest
import redis

from app_sim import auth
from app_sim.api import app as app_module
from app_sim.api import fastpath
from app_sim.api.metrics import ApiMetrics
from contract import functions, keys
from infra.settings import get_settings

NS = "fastpath"
USERS = 60


@pytest.fixture(scope="module")
def world(redis_url, tmp_path_factory):
    from stories.bench import populate_serving_store, timeline_users

    settings = get_settings(
        redis_url=redis_url,
        var_dir=tmp_path_factory.mktemp("fastpath-var"),
        views_namespace=NS,
        api_secret="fastpath-test",
        kafka_bootstrap="127.0.0.1:1",  # no broker: a read appends nothing
        fanout_threshold=8,  # some authors merged at read time
        serving_layout="keyed",  # the store below is written in the keyed layout by hand
    )
    users = populate_serving_store(settings, NS, users=USERS, seed=3)
    many, empty = timeline_users(settings, NS, users)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    client.function_load(functions.source(), replace=True)
    # seal every post's text, then erase one of the reader's authors: their posts leave the timeline
    store = keys.KeyStore.for_settings(settings)
    sealer = keys.Sealer(store)
    for k in client.scan_iter(match=functions.key(NS, "p", "*"), count=1000):
        body = orjson.loads(client.get(k))
        sealed = sealer.seal({"type": "post_created", "user_id": body["author_id"], "text": body["text"]})
        client.set(k, orjson.dumps({**body, "text": sealed["text"]}))
    _fence, bodies = client.fcall_ro("social_timeline", 0, NS, many["user_id"], 50)
    authors = sorted({orjson.loads(b)["author_id"] for b in bodies} - {many["user_id"]})
    store.erase(authors[0])
    store.close()
    revoked, erased = users[1], users[2]
    client.sadd(auth.REVOKED_KEY, revoked)
    client.sadd(f"{NS}:erased", erased)
    signer = auth.TokenSigner(auth.load_secret(settings))
    tokens = {name: signer.issue(u) for name, u in (("many", many["user_id"]), ("empty", empty["user_id"]))}
    tokens |= {"revoked": signer.issue(revoked), "erased": signer.issue(erased)}
    return settings, tokens, authors[0]


def _requests(tokens: dict) -> list[tuple[str, bytes, list]]:
    many = tokens["many"]
    bearer = [(b"authorization", f"Bearer {many}".encode())]
    out = [
        ("GET", b"limit=50", bearer),
        ("GET", b"", bearer),
        ("GET", b"limit=3", bearer),
        ("GET", b"limit=800", bearer),
        ("GET", b"limit=801", bearer),
        ("GET", b"limit=0", bearer),
        ("GET", b"limit=050", bearer),
        ("GET", b"limit=abc", bearer),
        ("GET", b"limit=5&limit=7", bearer),
        ("GET", b"limit=5&x=1", bearer),
        ("GET", b"limit=50", []),
        ("GET", b"limit=50", [(b"authorization", f"bearer {many}".encode())]),
        ("GET", b"limit=50", [(b"authorization", f"Bearer  {many} ".encode())]),
        ("GET", b"limit=50", [(b"authorization", f"Basic {many}".encode())]),
        ("GET", b"limit=50", [(b"authorization", b"Bearer")]),
        ("GET", b"limit=50", [(b"authorization", f"Bearer {many}x".encode())]),
        ("GET", b"limit=50", [(b"authorization", "Bearer ünï".encode("latin-1"))]),
        ("GET", b"limit=50", [(b"authorization", b"Bearer nope"), *bearer]),
        ("GET", b"limit=50", [*bearer, (b"authorization", b"Bearer nope")]),
        ("GET", b"limit=0", [(b"authorization", f"Bearer {tokens['revoked']}".encode())]),
        ("POST", b"", bearer),
        ("HEAD", b"", bearer),
    ]
    out += [("GET", b"limit=50", [(b"authorization", f"Bearer {tokens[n]}".encode())]) for n in tokens]
    return out


async def _call(app, method: str, query: bytes, headers: list, path: str = "/v1/timeline") -> tuple:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "root_path": "",
        "headers": [(b"host", b"test"), *headers],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
        "state": {},
    }
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    start, body = sent[0], b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], start["headers"], body


def _answers(settings, tokens: dict, *, fast: bool, monkeypatch) -> tuple[list, list, int]:
    """The answers to :func:`_requests`, the metrics observed, and how many the fast path gave."""
    monkeypatch.setattr(app_module, "claim_worker_id", lambda _settings: 1)
    answer, answered = fastpath.TimelineFastPath._answer, []

    async def counted(self, scope, receive, send):
        done = fast and await answer(self, scope, receive, send)
        answered.append(done)
        return done

    monkeypatch.setattr(fastpath.TimelineFastPath, "_answer", counted)
    calls = []
    monkeypatch.setattr(ApiMetrics, "observe", lambda self, *a: calls.append(a[:3]))
    app = app_module.create_app(settings)

    async def run():
        async with app.router.lifespan_context(app):
            return [await _call(app, *r) for r in _requests(tokens)]

    answers = asyncio.run(run())
    monkeypatch.undo()
    return answers, calls, sum(answered)


def test_the_fast_path_answers_every_request_as_the_route_does(world, monkeypatch):
    settings, tokens, erased_author = world
    fast, fast_metrics, by_fast_path = _answers(settings, tokens, fast=True, monkeypatch=monkeypatch)
    slow, slow_metrics, _ = _answers(settings, tokens, fast=False, monkeypatch=monkeypatch)
    # the plain reads (no query, limit=3/50/800, both token spellings HTTPBearer takes, the first of
    # two Authorization headers, the empty timeline): the rest is the route's
    assert by_fast_path == 9
    for request, a, b in zip(_requests(tokens), fast, slow, strict=True):
        assert a == b, request
    assert fast_metrics == slow_metrics
    statuses = {a[0] for a in fast}
    assert {200, 401, 405, 422} <= statuses
    # the reader's timeline: sealed texts opened, the erased author's posts gone
    body = orjson.loads(fast[0][2])
    assert len(body["posts"]) > 0 and all(not p["text"].startswith("sealed:") for p in body["posts"])
    assert erased_author not in {p["author_id"] for p in body["posts"]}


def test_a_store_that_does_not_answer_is_the_routes_503(world, monkeypatch):
    settings, tokens, _ = world
    with socket_closed() as url:
        down = dataclasses.replace(settings, redis_url=url)
        fast, _, by_fast_path = _answers(down, tokens, fast=True, monkeypatch=monkeypatch)
        slow, _, _ = _answers(down, tokens, fast=False, monkeypatch=monkeypatch)
    assert fast[0][0] == 503 and fast[0] == slow[0] and by_fast_path > 0


class socket_closed:
    """A Redis URL where nothing listens."""

    def __enter__(self) -> str:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        return f"redis://127.0.0.1:{port}/0"

    def __exit__(self, *exc) -> None:
        return None
