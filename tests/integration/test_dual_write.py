"""Each injected fault makes dual writes diverge from the log; the log design never does.

A small seeded run through the real API (``python -m app_sim.api``, 2 uvicorn workers, as
``make up`` runs it), Kafka and Redis, per write mode: users are registered through a fault-free
API, then one API per fault (only that fault on) serves a scenario that fault can hurt:

- ``crash`` (250 per mille): 12 messages to one inbox, retried after the dropped connection;
- ``race`` (every counter update held up to 300 ms): 12 messages to one inbox at once;
- ``timeout`` (every write stalls 1.2 s, the client gives up after 0.4 s and retries twice):
  2 messages;
- ``store_fail`` (every store update after the log append fails): 3 messages and a post the
  recipient's timeline should get.

Dual mode is compared with an independent fold of its topic (``infra.dual_write.fold``); log mode
is the real speed layer's namespace over its topic, compared with the same fold.
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import httpx
import pytest

from app_sim.api.dual_write import FAULTS
from infra.dual_write import attribute, divergences, fold, read_journal, read_log, read_store

pytestmark = pytest.mark.integration

RATES = {"crash": 250, "race": 1000, "timeout": 1000, "store_fail": 1000}
CLIENT_TIMEOUT_S = 0.4
STALL_MS = 1200


def _write(url: str, path: str, token: str, body: dict, retries: int = 6) -> httpx.Response | None:
    """A careful client: one Idempotency-Key per write, retried on no answer or a 5xx."""
    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": uuid.uuid4().hex}
    answer = None
    for attempt in range(retries + 1):
        try:
            answer = httpx.post(f"{url}{path}", json=body, headers=headers, timeout=CLIENT_TIMEOUT_S)
            if answer.status_code < 500:
                return answer
        except httpx.TransportError:  # timed out, or the worker died under us
            pass
        time.sleep(0.3 * (attempt + 1))
    return answer


def _api(settings, **faults):
    from infra.stack import ApiServer

    api = ApiServer(replace(settings, **{f"fault_{f}_permille": faults.get(f, 0) for f in FAULTS}))
    api.start()
    return api


def _scenario(fault: str, url: str, users: dict[str, tuple[int, str]]) -> None:
    recipient, _ = users["recipient"]
    sender, sender_token = users["sender"]

    retries = 2 if fault == "timeout" else 6  # every attempt stalls: three of them land late

    def message(i: int) -> None:
        body = {"recipient_id": recipient, "text": f"{fault} {i}"}
        _write(url, "/v1/messages", sender_token, body, retries)

    if fault == "race":
        with ThreadPoolExecutor(12) as pool:
            list(pool.map(message, range(12)))
    else:
        for i in range({"crash": 12, "timeout": 2, "store_fail": 3}[fault]):
            message(i)
    if fault == "store_fail":
        _write(url, "/v1/posts", sender_token, {"text": "fan me out"})
    if fault == "timeout":
        time.sleep(STALL_MS / 1000 * 2)  # the stalled originals land after their retries


def _register(url: str, handle: str) -> tuple[int, str]:
    answer = httpx.post(f"{url}/v1/users", json={"handle": handle, "display_name": handle}, timeout=15)
    assert answer.status_code == 201, answer.text
    return answer.json()["user_id"], answer.json()["token"]


def _run_mode(mode: str, base, topic: str, namespace: str) -> None:
    """Register each scenario's users (fault-free API) with a follow, then one API per fault."""
    from app_sim.load import api_is_up

    settings = replace(
        base,
        events_topic=topic,
        write_mode=mode,
        views_namespace=namespace,  # reads: the speed layer's namespace, or dual mode's own
        dual_namespace=namespace,
        fault_seed=11,
        fault_race_ms=300,
        fault_stall_ms=STALL_MS,
    )
    url = f"http://127.0.0.1:{settings.api_port}"
    users: dict[str, dict[str, tuple[int, str]]] = {}
    api = _api(settings)
    try:
        for fault in FAULTS:
            users[fault] = {
                role: _register(url, f"{fault[:6]}{role[:4]}") for role in ("recipient", "sender")
            }
            recipient_token = users[fault]["recipient"][1]
            answer = _write(url, "/v1/follows", recipient_token, {"followee_id": users[fault]["sender"][0]})
            assert answer is not None and answer.status_code == 202, answer
    finally:
        api.stop()
    for fault in FAULTS:
        api = _api(settings, **{fault: RATES[fault]})
        try:
            assert api_is_up(url)
            _scenario(fault, url, users[fault])
        finally:
            api.stop()


@pytest.fixture(scope="module")
def runs(kafka_stack, tmp_path_factory):
    """mode -> (divergences, attribution, journal) after the seeded scenarios."""
    from infra.dual_write import SpeedLayerRun
    from infra.stack import create_topic, delete_topic
    from pipelines.serving import connect

    base = replace(
        kafka_stack.settings,
        var_dir=tmp_path_factory.mktemp("dual-write-var"),
        api_port=_free_port(),
        api_workers=2,
    )
    r = connect(base.redis_url)
    tag = uuid.uuid4().hex[:6]
    topics = {mode: f"test.dual_write.{mode}.{tag}" for mode in ("log", "dual")}
    for topic in topics.values():
        create_topic(base, topic, base.events_partitions)
    _run_mode("log", base, topics["log"], f"log{tag}")
    # the log design's store: the real speed layer over the whole topic (one micro-batch, the
    # cheapest on a busy machine; the views are a function of the log, not of when it runs),
    # starting while the dual mode runs
    speed_layer = SpeedLayerRun(replace(base, events_topic=topics["log"]), topics["log"], f"log{tag}")
    try:
        _run_mode("dual", base, topics["dual"], f"dual{tag}")
        speed_layer.wait_caught_up(r, timeout_s=420)
    finally:
        speed_layer.stop()
    out = {}
    for mode, topic in topics.items():
        found = divergences(read_store(r, f"{mode}{tag}"), fold(read_log(base, topic)))
        journal = read_journal(r, topic)
        out[mode] = (found, attribute(found, journal), journal)
    yield out
    for topic in topics.values():
        delete_topic(base, topic)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TIMEOUT_KNOWN_ISSUE = pytest.mark.xfail(
    strict=False,
    reason="the API's shared idempotency keys (issue 17) answer a retry of a stalled write 409 "
    "while the original is in flight, so this scenario's retries no longer double-write; its "
    "divergence now depends on timing (open in issue 16)",
)


@pytest.mark.parametrize(
    "fault", [pytest.param(f, marks=TIMEOUT_KNOWN_ISSUE) if f == "timeout" else f for f in FAULTS]
)
def test_each_fault_makes_dual_writes_diverge(runs, fault):
    found, by_fault, journal = runs["dual"]
    injected = [j for j in journal if j["fault"] == fault]
    assert injected, f"the seeded run injected no {fault}"
    assert sum(by_fault[fault].values()) >= 1, (fault, {m: len(v) for m, v in found.items()}, by_fault)


def test_the_log_design_does_not_diverge_under_the_same_faults(runs):
    found, _, journal = runs["log"]
    injected = {f: sum(1 for j in journal if j["fault"] == f) for f in FAULTS}
    # the same faults hit the log mode's requests (a store write to fail exists in dual mode only)
    assert injected["crash"] >= 1 and injected["race"] >= 1 and injected["timeout"] >= 1, injected
    assert found == {m: [] for m in found}
